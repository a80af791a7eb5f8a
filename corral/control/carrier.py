"""Carries out the decisions of the pure rules (``supervisor`` for replicas, ``lifecycle``
for the job group): each becomes journalled state moves (``transitions``) and, where
something must happen outside the store, queued effects done after the commit
(``effects``). The loop's steps that stop or signal replicas go through here too, so a
stop is always the task's stop signal, a SIGKILL deadline journalled with it, and the kill
itself when the deadline passes."""

from __future__ import annotations

from collections.abc import Callable

from corral.control import startorder
from corral.control.book import Book
from corral.control.decisions import (Decision, End, EndJob, Kill, Relaunch, Replace, RequeueJob, Restart, SetDeadline,
                                      SetReady, Signal, Stop, WakeAt, check)
from corral.control.effects import Effects
from corral.control.inventory import Inventory
from corral.control.probing import Probes
from corral.control.records import JobRec, ReplicaRec
from corral.control.supervisor import Supervisor
from corral.control.transitions import Transitions
from corral.metrics import Metrics
from corral.spec.service import signal_number
from corral.states import JobState, ReplicaState


class Carrier:
    def __init__(self, book: Book, moves: Transitions, effects: Effects, inventory: Inventory,
                 supervisor: Supervisor, probes: Probes, metrics: Metrics):
        self.book, self.moves, self.effects, self.inventory = book, moves, effects, inventory
        self.supervisor, self.probes, self.metrics = supervisor, probes, metrics
        self._restart_causes: dict[int, str] = {}  # replica -> why its next restart happens (metrics)
        self.on_end: Callable[[JobRec, JobState, float], None] | None = None  # told of every job's end (run times)

    def apply(self, job: JobRec, decisions: list[Decision], now: float) -> None:
        """Journal each decision with its cause and queue what it makes happen."""
        by_id = {r.id: r for r in job.replicas}
        for d in decisions:
            if isinstance(d, SetDeadline):
                task = job.task(d.task)
                task.termination_deadline = d.deadline
                self.moves.journal.task(task.id, termination_deadline=d.deadline)
                self.moves.event(job.id, now, d.task, "termination_delay",
                                 f"primaries done; stopping {d.task} in {d.deadline - now:.1f}s")
                continue
            if isinstance(d, WakeAt):
                self.book.wake_at(d.at, job.id)
                continue
            if isinstance(d, EndJob):
                self.end_job(job, d, now)
                continue
            replica = by_id[d.replica_id]
            check(d, replica.state)
            if isinstance(d, SetReady):
                self.set_ready(job, replica, d.ready, now, d.detail)
            elif isinstance(d, Signal):
                if d.grace is not None:  # the exit that follows is restarted for this cause
                    self._restart_causes[replica.id] = d.cause
                self.signal(job, replica, d.cause, now, d.message, d.signal, d.grace)
            elif isinstance(d, Kill):
                self.moves.event(job.id, now, replica.label, "killed",
                                 "cancel --force: SIGKILL" if job.force_kill else "grace period over: SIGKILL")
                self.effects.kill(replica.infra or self.inventory.infra_of_node(replica.node or ""), replica.handle,
                                  f"job {job.id} {replica.label}")
                replica.kill_at = None
                self.moves.journal.replica(replica.id, kill_at=None)
            elif isinstance(d, Stop):
                self.stop(job, replica, d.cause, now)
            elif isinstance(d, Restart):
                self._restart(job, replica, d, now)
            elif isinstance(d, Relaunch):
                self.metrics.restarts.labels(cause=self._restart_causes.pop(replica.id, "exit")).inc()
                replica.restarts += 1
                replica.restart_at, replica.exit_code, replica.kill_at = None, None, None
                replica.attempt += 1  # a new key, committed before the launch
                replica.handle = None
                self.moves.replica_to(replica, ReplicaState.STARTING, "restart", now, d.message,
                                      restarts=replica.restarts, restart_at=None, exit_code=None,
                                      attempt=replica.attempt, handle=None)
                self.book.launch_check.add(job.id)
            elif isinstance(d, Replace):
                self._restart_causes.pop(replica.id, None)
                self.metrics.restarts.labels(cause="node_lost").inc()
                replica.restarts += 1
                replica.restart_at, replica.exit_code, replica.kill_at = None, None, None
                self.book.free(replica.id)
                replica.node, replica.gpus, replica.handle = None, (), None
                self.moves.replica_to(replica, ReplicaState.PENDING, "restart", now, d.message,
                                      restarts=replica.restarts, restart_at=None, exit_code=None, node=None, gpus=[],
                                      handle=None)
            elif isinstance(d, RequeueJob):
                self._requeue_job(job, replica, d, now)
            elif isinstance(d, End):
                replica.ready = False
                replica.ended = (d.cause, d.message or "")
                self.moves.replica_to(replica, d.state, d.cause, now, d.message, exit_code=d.exit_code, ended_at=now,
                                      ready=False, handle=None)
                self.book.dirty.add(job.id)
            else:  # pragma: no cover - a decision kind without a carrier is a bug
                raise TypeError(f"no way to carry out {d!r}")

    def _restart(self, job: JobRec, replica: ReplicaRec, d: Restart, now: float) -> None:
        replica.restart_at, replica.ready, replica.handle = d.at, False, None
        self.moves.replica_to(replica, ReplicaState.RESTARTING, "restart_scheduled", now, d.message,
                              exit_code=d.exit_code, last_exit_code=d.exit_code, ended_at=now,
                              restart_at=d.at, ready=False, handle=None, kill_at=None)
        replica.kill_at = None
        self.book.wake_at(d.at, job.id)

    def _requeue_job(self, job: JobRec, replica: ReplicaRec, d: RequeueJob, now: float) -> None:
        # Its node is gone and it may not restart: requeue the whole job, as Slurm does for a
        # job whose node failed (same id, same names, same checkpoint directory).
        job.requeue_requested = True
        self.moves.journal.job(job.id, requeue_requested_at=now)
        if d.hold:
            job.hold = d.hold
            self.moves.journal.job(job.id, hold=d.hold)
        replica.ready = False
        self.moves.replica_to(replica, ReplicaState.FAILED, "lost", now, d.message, ended_at=now, ready=False,
                              handle=None)
        self.moves.job_to(job, JobState.PREEMPTED, now, "node_lost", d.job_message)
        for other in job.members:
            if not other.state.terminal and other.stop_requested_at is None:
                self.stop(job, other, "node_lost", now)

    def end_job(self, job: JobRec, end: EndJob, now: float) -> None:
        """The job is over: its end is journalled; its reservations and files are given back
        once that is durable."""
        self.moves.job_to(job, end.state, now, end.cause, end.message, exit_code=end.exit_code, message=end.message)
        self.book.active.pop(job.id, None)
        self.book.publish.discard(job.id)
        self.effects.release(job.id, end.state.value)
        if self.on_end is not None:
            self.on_end(job, end.state, now)

    # -- what several steps do to replicas ------------------------------------------------------
    def stop(self, job: JobRec, replica: ReplicaRec, cause: str, now: float) -> None:
        """Stop for good: the task's stop signal and grace period, or KILLED at once if no
        process runs for it."""
        replica.stop_requested_at, replica.stop_cause = now, cause
        self.moves.journal.replica(replica.id, stop_requested_at=now, stop_cause=cause)
        if replica.handle is None:  # nothing runs for it (waiting, or between restarts)
            self.moves.replica_to(replica, ReplicaState.KILLED, cause, now, ended_at=now, ready=False)
            self.book.touch(job.id)  # the job may be over now: look again at once, not at the next timer
        else:
            self.signal(job, replica, cause, now, "stop requested")
        # if the signal finds the process gone, its exit report is on its way

    def signal(self, job: JobRec, replica: ReplicaRec, cause: str, now: float, message: str,
               signame: str | None = None, grace: float | None = -1.0) -> None:
        """Send a signal (the task's stop signal by default) and, unless ``grace`` is None
        (a warning), arm SIGKILL after the grace period (the task's by default)."""
        if replica.handle is None:
            return
        service = job.task(replica.task).service
        signame = signame or service.stop_signal
        infra = replica.infra or self.inventory.infra_of_node(replica.node or "")
        what = f"job {job.id} {replica.label}"
        if grace is None:
            self.effects.signal(infra, replica.handle, signal_number(signame), what)
            self.moves.event(job.id, now, replica.label, cause, message)
            return
        grace = 0.0 if job.force_kill else service.grace_period if grace < 0 else grace
        self.effects.signal(infra, replica.handle, signal_number(signame), what, (job.id, replica.id, grace))
        replica.kill_at = now + grace  # moved later by ``regrace`` once the signal is really sent
        self.moves.journal.replica(replica.id, kill_at=replica.kill_at)
        self.book.wake_at(replica.kill_at, job.id)
        self.moves.event(job.id, now, replica.label, cause, f"{message}; {signame} sent, SIGKILL after {grace:g}s")

    def regrace(self) -> None:
        """Count each signal's grace from when it was sent (after the commit), not from the
        cycle that decided it."""
        sent, self.effects.signalled = self.effects.signalled, []
        found, self.effects.found_ended = self.effects.found_ended, []
        for job_id, replica_id, key in found:
            # the attempt had ended on its own before its stop went out (its exit report, not
            # drained yet, comes after the ask): the supervisor ends it as its exit says
            job = self.book.active.get(job_id)
            replica = next((r for r in job.replicas if r.id == replica_id), None) if job else None
            if replica is not None and replica.stop_requested_at is not None and replica.launch_key == key:
                replica.ended_before_stop = key
        for job_id, replica_id, earliest in sent:
            job = self.book.active.get(job_id)
            replica = next((r for r in job.replicas if r.id == replica_id), None) if job else None
            if replica is None or replica.kill_at is None or replica.handle is None or earliest <= replica.kill_at:
                continue
            replica.kill_at = earliest
            self.moves.journal.replica(replica.id, kill_at=earliest)
            self.book.wake_at(earliest, job_id)

    def kill_now(self, job: JobRec, replica: ReplicaRec) -> None:
        """SIGKILL the attempt's whole tree after the commit (a job the loop gives up on)."""
        if replica.handle is not None:
            self.effects.kill(replica.infra or self.inventory.infra_of_node(replica.node or ""), replica.handle,
                              f"job {job.id} {replica.label}")

    def set_ready(self, job: JobRec, replica: ReplicaRec, ready: bool, now: float, detail: str) -> None:
        replica.ready = ready
        self.moves.journal.replica(replica.id, ready=ready)
        self.moves.event(job.id, now, replica.label, "ready" if ready else "not_ready", detail)
        self.book.publish.add(job.id)
        if startorder.waiting(job):
            self.book.launch_check.add(job.id)

    def arm(self, job: JobRec, replica: ReplicaRec) -> None:
        """An attempt runs: the times its job must be looked at again (startup timeout, time
        limit and its warning)."""
        for at in self.supervisor.watch(job, replica):
            self.book.wake_at(at, job.id)

    def forget_attempt(self, key: str) -> None:
        self.probes.forget(key)
        self.supervisor.forget(key)

