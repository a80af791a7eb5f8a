"""Replica supervision as pure decisions: typed events in, decisions out, no I/O.

The control loop is drain → decide → journal → execute. This module is the "decide" for
everything that happens to a replica once its job holds resources:

  * an attempt ended (``AttemptEnded``: exit code, or lost with a reason) → restart after
    the policy's backoff, requeue the whole job (its node is gone and it may not restart),
    or end the replica SUCCEEDED / FAILED / KILLED;
  * a member of a gang (a multi-node service replica) ended on its own → its peers are
    stopped and restart with it, or stop for good where it does not restart;
  * a probe answered (``ProbeAnswered``) → ready / not ready after the success / failure
    thresholds, or the stop signal for a liveness failure (the restart policy decides next);
  * time passed (``review``) → due restarts (same node: a new attempt; node gone: placed
    again by the scheduler, so every limit holds), waiting replicas whose dependency can
    never be met, startup timeouts, time-limit warnings and stops, grace periods over.

Job-level rules (primaries, termination delays, job ends) are ``lifecycle.evaluate``'s; both
speak the one vocabulary of ``decisions``. The ``Supervisor`` keeps the little memory
supervision needs between events (probe streaks, warnings sent) — like dask's worker state
machine it never touches a process, a file or the store; the loop's carrier carries each
decision out and journals it with its cause."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from corral.control import startorder
from corral.control.decisions import (LIVE, Decision, End, Kill, Relaunch, Replace, RequeueJob, Restart, SetReady,
                                      Signal, Stop)
from corral.control.records import JobRec, ReplicaRec
from corral.spec.service import SERVICE_RESTARTS
from corral.states import JobState, ReplicaState

# -- events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptEnded:
    """The executor saw an attempt end: an exit code, or lost (no code) with a reason."""
    replica_id: int
    code: int | None
    lost: bool = False
    reason: str | None = None
    node_up: bool = True  # its node is still in the inventory
    permanent: bool = False  # a new attempt would fail the same way (a registry refused its image)
    unverified: bool = False  # lost where no one can make sure it ended (``Observed.unverified``)


@dataclass(frozen=True)
class ProbeAnswered:
    replica_id: int
    kind: str  # "readiness" | "liveness"
    ok: bool
    detail: str = ""


class Supervisor:
    """Decides; never does. One per control loop, fed on its one thread."""

    def __init__(self) -> None:
        self._streaks: dict[tuple[str, str], tuple[int, int]] = {}  # (attempt key, kind) -> (oks, fails) in a row
        self._last_failure: dict[str, str] = {}  # attempt key -> its readiness probe's last failure
        self._been_ready: set[str] = set()  # attempts whose readiness probe passed once
        self._warned: set[str] = set()  # attempts sent their time-limit warning
        # attempts stopped for not becoming ready in time: their exit (143 after SIGTERM) says so
        self._timed_out: dict[str, str] = {}
        # attempts stopped because a peer of their gang ended: restarted (at this time) with it
        self._gang_restart: dict[str, float] = {}

    def forget(self, key: str) -> None:
        """An attempt ended: drop what was kept about it."""
        for kind in ("readiness", "liveness"):
            self._streaks.pop((key, kind), None)
        self._last_failure.pop(key, None)
        self._been_ready.discard(key)
        self._warned.discard(key)
        self._timed_out.pop(key, None)
        self._gang_restart.pop(key, None)

    def watch(self, job: JobRec, replica: ReplicaRec) -> list[float]:
        """An attempt runs (launched, confirmed or adopted): the times at which ``review``
        must look at its job again (startup timeout, time-limit warning, time limit)."""
        task = job.task(replica.task)
        service, limit = task.service, job.time_limit_of(task)
        if replica.started_at is None:
            return []
        out = []
        if service.readiness_of(replica.rank) is not None:
            if replica.ready:
                self._been_ready.add(replica.launch_key)
            out.append(replica.started_at + service.startup_timeout)
        if limit is not None:
            out.append(replica.started_at + limit)
            if service.signal_before_timeout is not None:
                out.append(replica.started_at + limit - service.signal_before_timeout.seconds)
        return out

    # -- events ----------------------------------------------------------------------------
    def attempt_ended(self, job: JobRec, replica: ReplicaRec, event: AttemptEnded, now: float) -> list[Decision]:
        following = self._gang_restart.get(replica.launch_key)
        decisions = self._ended(job, replica, event, now, following)
        if following is not None:  # it follows a peer's end: the gang is already on its way
            return decisions
        return decisions + self._gang_follows(job, replica, decisions)

    def _gang_follows(self, job: JobRec, replica: ReplicaRec, decisions: list[Decision]) -> list[Decision]:
        """A member of a gang (a multi-node service replica) ended on its own: the gang is
        replaced as a whole, as a SkyServe replica's cluster is. Its live peers get the stop
        signal and restart with it (their exit is restarted whatever the policy says, and
        whatever code the signal gave), or, where it does not restart, stop for good."""
        service = job.task(replica.task).service
        mine = next((d for d in decisions if getattr(d, "replica_id", None) == replica.id), None)
        if service.gang_size <= 1 or not isinstance(mine, (Restart, End)) or replica.stop_requested_at is not None:
            return []
        gang = service.gang_of(replica.rank)
        peers = [r for r in job.replicas_of(replica.task) if r.id != replica.id and service.gang_of(r.rank) == gang
                 and r.state in LIVE and r.stop_requested_at is None and r.kill_at is None]
        if isinstance(mine, Restart):
            out: list[Decision] = []
            for peer in peers:
                if peer.handle is None:
                    continue  # not launched yet: it starts with the gang's new addresses anyway
                self._gang_restart[peer.launch_key] = mine.at
                out.append(Signal(peer.id, service.stop_signal, "gang_restart",
                                  f"{replica.label} of its gang ended; the gang restarts as a whole",
                                  service.grace_period))
            return out
        return [Stop(peer.id, "gang_ended") for peer in peers]

    def _ended(self, job: JobRec, replica: ReplicaRec, event: AttemptEnded, now: float,
               following: float | None) -> list[Decision]:
        timed_out = self._timed_out.get(replica.launch_key)
        self.forget(replica.launch_key)
        if timed_out:  # its exit is the stop signal's: what ended it is the timeout
            event = replace(event, reason="; ".join(r for r in (timed_out, event.reason) if r))
        if replica.state.terminal or replica.state not in LIVE:
            return []
        asked = replica.stop_requested_at is not None
        # its stop signal found it already ended: it ended on its own, as its exit code says
        # (an auxiliary failing just before the primaries' end stopped it is a failure)
        unheard = asked and replica.ended_before_stop is not None and replica.ended_before_stop == replica.launch_key
        policy = job.task(replica.task).service.restart
        code = None if event.lost else event.code
        ending = job.cancel_requested or job.ended_by is not None  # nothing restarts: the job is ending
        if following is not None and not asked and not ending and job.state != JobState.PREEMPTED:
            return [Restart(replica.id, max(now, following), code,
                            f"stopped for its gang's restart (exit code {code}); restarts with it")]
        if event.unverified and not ending and job.state in (JobState.RUNNING, JobState.STARTING):
            # a restart or a requeue that ran it again could run beside it: never alive twice
            return [RequeueJob(replica.id, f"lost: {event.reason}",
                               f"{replica.label} may still run where corral cannot see or stop it ({event.reason}); "
                               "the job is requeued and held: an operator releases it (corral release) once "
                               "that attempt is known to have ended", hold="admin")]
        if not asked and not ending and job.state != JobState.PREEMPTED and not event.permanent \
                and policy.should_restart(code, replica.restarts):
            delay = policy.backoff.delay(replica.restarts)
            why = f"exit code {code}" if code is not None else f"lost ({event.reason or 'exit code unknown'})"
            if code is not None and event.reason:  # what its log said (a port in use, a failed setup)
                why += f" ({event.reason})"
            elif timed_out:
                why += f" ({timed_out})"
            count = f"{replica.restarts + 1}" if policy.max_restarts >= SERVICE_RESTARTS else \
                f"{replica.restarts + 1}/{policy.max_restarts}"
            return [Restart(replica.id, now + delay, code,
                            f"{why}; restart {count} in {delay:g}s (policy {policy.policy})")]
        if event.lost and not asked and not event.node_up and not ending \
                and job.state in (JobState.RUNNING, JobState.STARTING):
            return [RequeueJob(replica.id, f"lost: {event.reason}",
                               f"node {replica.node} is down ({replica.label} was lost); the job is requeued")]
        if asked and code == 0 and replica.stop_cause == "termination_delay":
            # an auxiliary that ended well on its stop signal once the primaries were done
            # (a replay buffer flushing, a reward server closing): done, as Slurm's accounting
            # records it COMPLETED, not killed
            state, cause = ReplicaState.SUCCEEDED, "exited"
        elif asked and not (unheard and code is not None):
            state, cause = ReplicaState.KILLED, replica.stop_cause or "stopped"
        elif code == 0:
            state, cause = ReplicaState.SUCCEEDED, "exited"
        else:
            state, cause = ReplicaState.FAILED, "lost" if event.lost else "exited"
        message = f"exit code {code}" if code is not None else f"lost: {event.reason or 'exit code unknown'}"
        if event.reason and code is not None:
            message += f" ({event.reason})"
        if event.permanent and policy.should_restart(code, replica.restarts) and not asked and not ending:
            message += "; not restarted: every new attempt would meet the same refusal"
        return [End(replica.id, state, cause, message, code)]

    def probe_answered(self, job: JobRec, replica: ReplicaRec, event: ProbeAnswered, now: float) -> list[Decision]:
        if replica.state != ReplicaState.RUNNING:
            return []
        key = replica.launch_key
        service = job.task(replica.task).service
        oks, fails = self._streaks.get((key, event.kind), (0, 0))
        oks, fails = (oks + 1, 0) if event.ok else (0, fails + 1)
        self._streaks[(key, event.kind)] = (oks, fails)
        if event.kind == "readiness":
            probe = service.readiness_of(replica.rank)
            if probe is None:
                return []
            if not event.ok:
                self._last_failure[key] = event.detail
            if not replica.ready and oks >= probe.success_threshold:
                self._been_ready.add(key)
                return [SetReady(replica.id, True, event.detail)]
            if replica.ready and fails >= probe.failure_threshold:
                return [SetReady(replica.id, False, event.detail)]
            return []
        probe = service.liveness_of(replica.rank)
        if probe is None or fails < probe.failure_threshold or replica.kill_at is not None:
            return []
        self._streaks.pop((key, event.kind), None)
        return [Signal(replica.id, service.stop_signal, "liveness_failed",
                       f"liveness probe failed {fails}x ({event.detail})", service.grace_period)]

    def review(self, job: JobRec, now: float, node_up: Callable[[str | None], bool]) -> list[Decision]:
        """What time alone decides for a job's replicas at ``now``."""
        out: list[Decision] = []
        for replica in job.replicas:
            if replica.state == ReplicaState.RESTARTING and replica.stop_requested_at is None \
                    and replica.restart_at is not None and replica.restart_at <= now:
                number = replica.restarts + 1
                if node_up(replica.node):
                    out.append(Relaunch(replica.id, f"attempt {replica.attempt + 1}"))
                else:
                    out.append(Replace(replica.id, f"restart {number}: its node is down; placing it again"))
        for replica, why in startorder.blocked_forever(job):
            out.append(End(replica.id, ReplicaState.FAILED, "dependency_failed", why))
        for replica in job.replicas:
            out.extend(self._timed(job, replica, now))
        return out

    def _timed(self, job: JobRec, replica: ReplicaRec, now: float) -> list[Decision]:
        out: list[Decision] = []
        task = job.task(replica.task)
        service, limit = task.service, job.time_limit_of(task)
        running = replica.state == ReplicaState.RUNNING and replica.started_at is not None
        if replica.kill_at is not None and replica.kill_at <= now and replica.handle is not None:
            out.append(Kill(replica.id))
        if not running or replica.stop_requested_at is not None:
            return out
        limit_at = replica.started_at + limit if limit is not None else None  # type: ignore[operator]
        warn = service.signal_before_timeout
        key = replica.launch_key
        if limit_at is not None and warn is not None and now >= limit_at - warn.seconds and key not in self._warned:
            self._warned.add(key)
            out.append(Signal(replica.id, warn.signal, "time_limit_warning",
                              f"{warn.signal} sent {max(0.0, limit_at - now):.1f}s before the time limit", None))
        if limit_at is not None and now >= limit_at:
            out.append(Stop(replica.id, "time_limit"))
            return out
        if service.readiness_of(replica.rank) is not None and not replica.ready and replica.kill_at is None \
                and key not in self._been_ready and now >= replica.started_at + service.startup_timeout:  # type: ignore[operator]
            last = self._last_failure.get(key, "no probe answered yet")
            self._timed_out[key] = f"stopped: not ready {service.startup_timeout:g}s after start, its startup_timeout"
            out.append(Signal(replica.id, service.stop_signal, "startup_timeout",
                              f"readiness probe failing: {last}; not ready {service.startup_timeout:g}s after start",
                              service.grace_period))
        return out
