"""The service half of the control loop (mixed into ``Controller``): what makes a job group
more than a batch job. Readiness and liveness probes, per-replica restarts with backoff
that keep the name, address and GPUs, start ordering by ``depends_on``, and the discovery
files peers read. Kept apart from the scheduling half so each stays readable; both run on
the loop's one thread and share its records and journal."""

from __future__ import annotations

import heapq
import json
from collections import deque

from corral.control import startorder
from corral.control.records import JobRec, ReplicaRec
from corral.runtime.discovery import hosts_text, peers_document
from corral.scheduler import Allocation, PendingJob, TaskRequest
from corral.store import repository
from corral.runtime.probes import Prober, ProbeTarget
from corral.spec.service import signal_number
from corral.states import JobState, ReplicaState


class ServicesMixin:
    def _init_services(self) -> None:
        self.prober = Prober(self._on_probe)
        self._probe_results: deque[tuple[ProbeTarget, bool, str]] = deque()
        self._probe_streaks: dict[tuple[str, str], tuple[int, int]] = {}  # (key, kind) -> (oks, fails) in a row
        self._publish: set[int] = set()  # jobs whose discovery files are stale
        self._launch_check: set[int] = set()  # jobs that may have replicas ready to launch
        self._warned: set[tuple[str, str]] = set()  # (launch key, warning) already signalled
        self._probe_last: dict[str, str] = {}  # launch key -> its readiness probe's last failure
        self._been_ready: set[str] = set()  # attempts whose readiness probe passed once

    def _on_probe(self, target: ProbeTarget, ok: bool, detail: str) -> None:  # prober threads
        self._probe_results.append((target, ok, detail))
        self._wake.set()

    # -- discovery ------------------------------------------------------------------------
    def _publish_job(self, job: JobRec, now: float, launching: frozenset[int] = frozenset()) -> None:
        """Write the job's discovery files. Replicas in ``launching`` are about to start and
        are written as RUNNING already, so one write before the launch serves both the new
        processes and their peers (a launch that fails marks the job for another write)."""
        def state(r: ReplicaRec) -> tuple[str, bool]:
            if r.id in launching:
                return ReplicaState.RUNNING.value, job.task(r.task).service.readiness_probe is None
            return r.state.value, r.ready

        tasks = [{"name": t.name, "ports": t.service.ports,
                  "replicas": [{"rank": r.rank, "addr": r.addr, "state": state(r)[0], "ready": state(r)[1],
                                "restarts": r.restarts, "ports": r.ports or t.service.ports, "node": r.node}
                               for r in job.replicas_of(t.name)]} for t in job.tasks]
        peers = peers_document(job.id, job.name, tasks, now)
        hosts, text = hosts_text(peers), json.dumps(peers, indent=1)
        by_infra: dict[str, set[str]] = {}
        for r in job.replicas:
            if r.node is not None and not r.state.terminal:
                by_infra.setdefault(r.infra or self.node_infra.get(r.node, "local"), set()).add(r.node)
        by_infra.setdefault("local", set())  # the server's copy: API and local replicas read it
        for infra, nodes in by_infra.items():
            executor = self.executors.get(infra)
            if executor is not None:
                executor.publish(job.id, nodes, hosts, text)
        self._publish.discard(job.id)

    def _publish_marked(self, now: float) -> None:
        for job_id in sorted(self._publish):
            job = self.active.get(job_id)  # an ended job has nobody left to read its files
            if job is not None:
                self._publish_job(job, now)
        self._publish.clear()

    # -- probes ---------------------------------------------------------------------------
    def _watch_probes(self, job: JobRec, replica: ReplicaRec, env: dict[str, str] | None = None,
                      cwd: str | None = None) -> None:
        service = job.task(replica.task).service
        probes = [(kind, probe) for kind, probe in (("readiness", service.readiness_probe),
                                                     ("liveness", service.liveness_probe)) if probe is not None]
        if not probes:
            return
        if env is None:
            launch = self._launch_for(job, replica)
            env, cwd = launch.env, launch.cwd
        executor, handle = self.executor_of(replica), replica.handle

        def run_exec(command: str, timeout: float) -> tuple[bool, str]:  # where the replica runs
            return executor.exec_probe(handle, command, env, cwd, timeout)

        for kind, probe in probes:
            self.prober.watch(ProbeTarget(replica.launch_key, kind, probe, replica.addr or "127.0.0.1",
                                          dict(replica.ports or service.ports), env, cwd, run_exec))

    def _forget_probes(self, key: str) -> None:
        self.prober.forget(key)
        for kind in ("readiness", "liveness"):
            self._probe_streaks.pop((key, kind), None)
        self._probe_last.pop(key, None)
        self._been_ready.discard(key)

    def _collect_probe_results(self, now: float) -> None:
        while self._probe_results:
            target, ok, detail = self._probe_results.popleft()
            job_id, replica_id = self._by_key.get(target.key, (None, None))
            job = self.active.get(job_id)
            if job is None:
                continue
            replica = next(r for r in job.replicas if r.id == replica_id)
            if replica.state != ReplicaState.RUNNING:
                continue
            oks, fails = self._probe_streaks.get((target.key, target.kind), (0, 0))
            oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
            self._probe_streaks[(target.key, target.kind)] = (oks, fails)
            probe = target.probe
            if target.kind == "readiness":
                if not ok:
                    self._probe_last[target.key] = detail
                if not replica.ready and oks >= probe.success_threshold:
                    self._set_ready(job, replica, True, now, detail)
                elif replica.ready and fails >= probe.failure_threshold:
                    self._set_ready(job, replica, False, now, detail)
            elif fails >= probe.failure_threshold and replica.kill_at is None:
                self._probe_streaks.pop((target.key, target.kind), None)
                self._signal_replica(job, replica, "liveness_failed", now,
                                     f"liveness probe failed {fails}x ({detail})")

    def _set_ready(self, job: JobRec, replica: ReplicaRec, ready: bool, now: float, detail: str) -> None:
        replica.ready = ready
        if ready:
            self._been_ready.add(replica.launch_key)
        self.journal.replica(replica.id, ready=ready)
        self.journal.event(job.id, now, replica.label, "ready" if ready else "not_ready", message=detail)
        self._publish.add(job.id)
        if startorder.waiting(job):
            self._launch_check.add(job.id)

    def _signal_replica(self, job: JobRec, replica: ReplicaRec, cause: str, now: float, message: str) -> bool:
        """Send the task's stop signal and arm SIGKILL after its grace period."""
        handle = replica.handle
        service = job.task(replica.task).service
        if handle is None or not self.executor_of(replica).signal(handle, signal_number(service.stop_signal)):
            return False
        replica.kill_at = now + service.grace_period
        self.journal.replica(replica.id, kill_at=replica.kill_at)
        heapq.heappush(self._timers, (replica.kill_at, job.id))
        self.journal.event(job.id, now, replica.label, cause,
                           message=f"{message}; {service.stop_signal} sent, SIGKILL after {service.grace_period:g}s")
        return True

    # -- time limits ----------------------------------------------------------------------
    def _arm_time_limit(self, job: JobRec, replica: ReplicaRec) -> None:
        task = job.task(replica.task)
        service, limit = task.service, job.time_limit_of(task)
        if service.readiness_probe is not None and replica.started_at is not None:
            if replica.ready:
                self._been_ready.add(replica.launch_key)
            heapq.heappush(self._timers, (replica.started_at + service.startup_timeout, job.id))
        if limit is None or replica.started_at is None:
            return
        limit_at = replica.started_at + limit
        heapq.heappush(self._timers, (limit_at, job.id))
        if service.signal_before_timeout is not None:
            heapq.heappush(self._timers, (limit_at - service.signal_before_timeout.seconds, job.id))

    def _check_startup(self, job: JobRec, now: float) -> None:
        """A replica whose readiness probe never passed within its task's startup_timeout
        failed to start: its stop signal, then its restart policy decides (not left
        STARTING-forever with no reason)."""
        for replica in job.replicas:
            service = job.task(replica.task).service
            if service.readiness_probe is None or replica.state != ReplicaState.RUNNING or replica.ready \
                    or replica.started_at is None or replica.stop_requested_at is not None \
                    or replica.kill_at is not None or replica.launch_key in self._been_ready \
                    or now < replica.started_at + service.startup_timeout:
                continue
            last = self._probe_last.get(replica.launch_key, "no probe answered yet")
            self._signal_replica(job, replica, "startup_timeout", now,
                                 f"readiness probe failing: {last}; not ready {service.startup_timeout:g}s after start")

    def _check_time_limits(self, job: JobRec, now: float) -> None:
        """Warn (Slurm's --signal) and then stop replicas whose task's time limit ran out."""
        self._check_startup(job, now)
        for replica in job.replicas:
            task = job.task(replica.task)
            service, limit = task.service, job.time_limit_of(task)
            if limit is None or replica.state != ReplicaState.RUNNING or replica.started_at is None \
                    or replica.stop_requested_at is not None:
                continue
            limit_at = replica.started_at + limit
            warn = service.signal_before_timeout
            key = (replica.launch_key, "time_limit_warning")
            if warn is not None and now >= limit_at - warn.seconds and key not in self._warned:
                self._warned.add(key)
                handle = replica.handle
                if handle is not None and self.executor_of(replica).signal(handle, signal_number(warn.signal)):
                    self.journal.event(job.id, now, replica.label, "time_limit_warning",
                                       message=f"{warn.signal} sent {max(0.0, limit_at - now):.1f}s before the time limit")
            if now >= limit_at:
                self._stop_replica(job, replica, "time_limit", now)

    # -- restarts -------------------------------------------------------------------------
    def _maybe_restart(self, job: JobRec, replica: ReplicaRec, code: int | None, now: float, event=None) -> bool:
        """After an exit corral did not ask for: restart per the task's policy, keeping the
        replica's rank, name, address and GPUs (its allocation is held meanwhile). A replica
        lost with its node is placed again elsewhere when its restart is due (same name, new
        address)."""
        policy = job.task(replica.task).service.restart
        if job.cancel_requested or job.state == JobState.PREEMPTED or not policy.should_restart(code, replica.restarts):
            return False
        delay = policy.backoff.delay(replica.restarts)
        replica.restart_at, replica.ready, replica.handle = now + delay, False, None
        why = f"exit code {code}" if code is not None else f"lost ({event.reason if event and event.reason else 'exit code unknown'})"
        self._replica_to(replica, ReplicaState.RESTARTING, "restart_scheduled", now,
                         f"{why}; restart {replica.restarts + 1}/{policy.max_restarts} in {delay:g}s "
                         f"(policy {policy.policy})", exit_code=code, last_exit_code=code, ended_at=now,
                         restart_at=replica.restart_at, ready=False, handle=None, kill_at=None)
        heapq.heappush(self._timers, (replica.restart_at, job.id))
        return True

    def _start_due_restarts(self, job: JobRec, now: float) -> None:
        for replica in job.replicas:
            if replica.state == ReplicaState.RESTARTING and replica.stop_requested_at is None \
                    and replica.restart_at is not None and replica.restart_at <= now:
                replica.restarts += 1
                replica.restart_at, replica.exit_code, replica.kill_at = None, None, None
                if replica.node not in self.node_infra:  # its node is gone: placed again elsewhere
                    self._allocs.pop(replica.id, None)
                    self._sched_needed = True
                    replica.node, replica.gpus, replica.handle = None, (), None
                    self._replica_to(replica, ReplicaState.PENDING, "restart", now,
                                     f"restart {replica.restarts}: its node is down; placing it again",
                                     restarts=replica.restarts, restart_at=None, exit_code=None, node=None, gpus=[],
                                     handle=None)
                    continue
                replica.attempt += 1  # a new key, committed before the launch
                replica.handle = None
                self._replica_to(replica, ReplicaState.STARTING, "restart", now, f"attempt {replica.attempt}",
                                 restarts=replica.restarts, restart_at=None, exit_code=None, attempt=replica.attempt,
                                 handle=None)
                self._launch_check.add(job.id)

    # -- elastic scale --------------------------------------------------------------------
    def _reconcile_scale(self, s, job: JobRec, task_name: str, count: int, now: float) -> None:
        """Grow a task with new (or revived) ranks for the scheduler to place, or shrink it by
        stopping its highest ranks with the task's stop signal and grace period."""
        task = job.task(task_name)
        task.num_nodes = count
        members = sorted(job.replicas_of(task_name), key=lambda r: r.rank)
        if count > len(members):
            self._sched_needed = True  # the new ranks are placed by the scheduler
            retired = {r.rank: r for r in job.replicas if r.task == task_name and r.retired}
            ranks = list(range(len(members), count))
            fresh = [rank for rank in ranks if rank not in retired]
            position = job.tasks.index(task)
            for rank, replica_id in zip(fresh, repository.add_replicas(s, job.id, task_name, position, fresh)):
                job.replicas.append(ReplicaRec(replica_id, job.id, task_name, rank, ReplicaState.PENDING))
                self.journal.event(job.id, now, f"{task_name}-{rank}", "scale_up", None, ReplicaState.PENDING.value)
            for rank in ranks:
                if rank in retired:
                    r = retired[rank]
                    r.stop_requested_at = r.stop_cause = r.exit_code = r.kill_at = r.handle = r.node = None
                    r.ready, r.gpus = False, ()
                    self._replica_to(r, ReplicaState.PENDING, "scale_up", now, stop_requested_at=None, stop_cause=None,
                                     exit_code=None, kill_at=None, handle=None, node=None, gpus=[],
                                     ended_at=None, ready=False)
            job.replicas.sort(key=lambda r: ([t.name for t in job.tasks].index(r.task), r.rank))
        else:
            for replica in members[count:]:
                if replica.stop_requested_at is not None and not replica.state.terminal:
                    continue  # already on its way out
                if replica.state.terminal:  # already ended: just leaves the membership
                    replica.stop_cause = "scale_down"
                    self.journal.replica(replica.id, stop_cause="scale_down")
                else:
                    self._stop_replica(job, replica, "scale_down", now)
        self.journal.event(job.id, now, task_name, "scaled", message=f"{len(members)} -> {count} replicas")
        self._publish.add(job.id)
        self._dirty.add(job.id)

    def _growth_requests(self, now: float) -> list[PendingJob]:
        """Replicas of running jobs waiting for a place (a task scaled up, or a replica whose
        node went away), each as a one-replica request the scheduler ranks and places like
        any job, so QOS and account limits, partitions and priorities hold at every instant.
        Their ids are the replicas' ids, negated."""
        out = []
        for job in self.active.values():
            if job.state not in (JobState.RUNNING, JobState.STARTING) or job.cancel_requested:
                continue
            for r in job.replicas:
                if r.state != ReplicaState.PENDING:
                    continue
                task = job.task(r.task)
                limit = job.time_limit_of(task)
                if limit is not None and job.started_at is not None:
                    limit = max(1.0, limit - (now - job.started_at))
                out.append(PendingJob(-r.id, (TaskRequest(task.name, 1, task.gpus, task.cpus, task.memory,
                                                          task.gpu_type),),
                                      job.submitted_at, job.user, job.account, limit, job.nice, job.partition,
                                      job.qos, job.priority, (), job.name))
        return out

    def _place_growth(self, replica_id: int, alloc: Allocation, now: float) -> None:
        for job in self.active.values():
            replica = next((r for r in job.replicas if r.id == replica_id), None)
            if replica is not None and replica.state == ReplicaState.PENDING:
                self._place(job, replica, Allocation(replica.task, replica.rank, alloc.node, alloc.gpus, alloc.cpus,
                                                     alloc.memory), now)
                self._launch_check.add(job.id)
                return

    def _fail_blocked(self, job: JobRec, now: float) -> None:
        for replica, why in startorder.blocked_forever(job):
            self._replica_to(replica, ReplicaState.FAILED, "dependency_failed", now, why, ended_at=now)
            self._dirty.add(job.id)
