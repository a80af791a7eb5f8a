"""The service half of the control loop (mixed into ``Controller``): what makes a job group
more than a batch job. Readiness and liveness probes, per-replica restarts with backoff
that keep the name, address and GPUs, start ordering by ``depends_on``, and the discovery
files peers read. Kept apart from the scheduling half so each stays readable; both run on
the loop's one thread and share its records and journal."""

from __future__ import annotations

import heapq
import json
import signal
from collections import deque

from corral.control import startorder
from corral.control.records import JobRec, ReplicaRec
from corral.control.supervisor import (Decision, End, Kill, ProbeAnswered, Relaunch, Replace, RequeueJob, Restart,
                                       SetReady, Signal, Stop, Supervisor, check)
from corral.control.balancer import Balancer
from corral.runtime.discovery import hosts_text, peers_document
from corral.scheduler import Allocation, PendingJob, TaskRequest
from corral.store import repository
from corral.control.probes import Prober, ProbeTarget
from corral.spec.service import signal_number
from corral.states import JobState, ReplicaState


class ServicesMixin:
    def _init_services(self) -> None:
        self.prober = Prober(self._on_probe)
        self._probe_results: deque[tuple[ProbeTarget, bool, str]] = deque()
        self._restart_causes: dict[int, str] = {}  # replica -> why its next restart happens (metrics)
        self.balancer: Balancer | None = None  # service endpoints, made when a job first has one
        self._endpoint_jobs: set[int] = set()  # active jobs with a task that has an endpoint
        self.supervisor = Supervisor()
        self._publish: set[int] = set()  # jobs whose discovery files are stale
        self._launch_check: set[int] = set()  # jobs that may have replicas ready to launch

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
        if any(t.service.endpoint is not None for t in job.tasks):
            self._endpoint_jobs.add(job.id)

    # -- service endpoints ------------------------------------------------------------------
    def _sync_endpoints(self, now: float) -> None:
        """Every endpoint of a live job listens (on the port it had, across server restarts)
        and routes to its task's READY replicas; a job's endpoints close when it ends."""
        for job_id in sorted(self._endpoint_jobs):
            job = self.active.get(job_id)
            if job is None or job.state not in (JobState.STARTING, JobState.RUNNING):
                self._close_endpoints(job_id)
                continue
            for task in job.tasks:
                endpoint = task.service.endpoint
                if endpoint is None or not self._open_endpoint(job, task, endpoint.policy, now):
                    continue
                name = next((n for n, p in task.service.ports.items() if n == endpoint.port or p == endpoint.port),
                            None)
                backends = []
                for r in job.replicas_of(task.name):
                    port = (r.ports or {}).get(name) if name else int(endpoint.port)
                    # a replica being stopped (scale-down, cancel) takes no new connections
                    if r.state == ReplicaState.RUNNING and r.ready and r.addr and port and r.stop_requested_at is None:
                        backends.append((r.addr, int(port)))
                self.balancer.route((job.id, task.name), backends)  # type: ignore[union-attr]

    def _open_endpoint(self, job: JobRec, task, policy: str, now: float) -> bool:  # noqa: ANN001 - a TaskRec
        key = (job.id, task.name)
        if self.balancer is None:
            self.balancer = Balancer()
        if key in self.balancer.keys():
            return True
        try:
            port = self.balancer.open(key, task.endpoint_port or 0, policy)
        except OSError as exc:
            if not task.endpoint_port:
                self.journal.event(job.id, now, task.name, "endpoint_failed", message=f"cannot listen: {exc}")
                return False
            port = self.balancer.open(key, 0, policy)  # its old port is taken: a new one, said loudly
            self.journal.event(job.id, now, task.name, "endpoint_moved",
                               message=f"port {task.endpoint_port} is taken ({exc.strerror}); now {port}")
        if port != task.endpoint_port:
            task.endpoint_port = port
            self.journal.task(task.id, endpoint_port=port)
            self.journal.event(job.id, now, task.name, "endpoint",
                               message=f"serving {self.balancer.host}:{port}, balanced over its READY replicas")
        return True

    def _close_endpoints(self, job_id: int) -> None:
        self._endpoint_jobs.discard(job_id)
        if self.balancer is not None:
            for key in [k for k in self.balancer.keys() if k[0] == job_id]:
                self.balancer.close(key)

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
        self.supervisor.forget(key)

    def _collect_probe_results(self, now: float) -> None:
        while self._probe_results:
            target, ok, detail = self._probe_results.popleft()
            job_id, replica_id = self._by_key.get(target.key, (None, None))
            job = self.active.get(job_id)
            if job is None:
                continue
            replica = next(r for r in job.replicas if r.id == replica_id)
            if replica.launch_key != target.key:
                continue
            if not ok:
                self.metrics.probe_failures.labels(probe=target.kind).inc()
            self._apply(job, self.supervisor.probe_answered(job, replica, ProbeAnswered(replica.id, target.kind, ok,
                                                                                        detail), now), now)

    def _arm(self, job: JobRec, replica: ReplicaRec) -> None:
        for at in self.supervisor.watch(job, replica):
            heapq.heappush(self._timers, (at, job.id))

    # -- carrying out the supervisor's decisions -------------------------------------------
    def _apply(self, job: JobRec, decisions: list[Decision], now: float) -> None:
        """Execute and journal what the supervisor decided, each with its cause."""
        by_id = {r.id: r for r in job.replicas}
        for d in decisions:
            replica = by_id[d.replica_id]
            check(d, replica.state)
            if isinstance(d, SetReady):
                self._set_ready(job, replica, d.ready, now, d.detail)
            elif isinstance(d, Signal):
                if d.grace is not None:  # the exit that follows is restarted for this cause
                    self._restart_causes[replica.id] = d.cause
                self._signal_replica(job, replica, d.cause, now, d.message, d.signal, d.grace)
            elif isinstance(d, Kill):
                if self.executor_of(replica).signal(replica.handle, signal.SIGKILL):
                    self.journal.event(job.id, now, replica.label, "killed", message="grace period over: SIGKILL")
                replica.kill_at = None
                self.journal.replica(replica.id, kill_at=None)
            elif isinstance(d, Stop):
                self._stop_replica(job, replica, d.cause, now)
            elif isinstance(d, Restart):
                replica.restart_at, replica.ready, replica.handle = d.at, False, None
                self._replica_to(replica, ReplicaState.RESTARTING, "restart_scheduled", now, d.message,
                                 exit_code=d.exit_code, last_exit_code=d.exit_code, ended_at=now,
                                 restart_at=d.at, ready=False, handle=None, kill_at=None)
                replica.kill_at = None
                heapq.heappush(self._timers, (d.at, job.id))
            elif isinstance(d, Relaunch):
                self.metrics.restarts.labels(cause=self._restart_causes.pop(replica.id, "exit")).inc()
                replica.restarts += 1
                replica.restart_at, replica.exit_code, replica.kill_at = None, None, None
                replica.attempt += 1  # a new key, committed before the launch
                replica.handle = None
                self._replica_to(replica, ReplicaState.STARTING, "restart", now, d.message,
                                 restarts=replica.restarts, restart_at=None, exit_code=None, attempt=replica.attempt,
                                 handle=None)
                self._launch_check.add(job.id)
            elif isinstance(d, Replace):
                self._restart_causes.pop(replica.id, None)
                self.metrics.restarts.labels(cause="node_lost").inc()
                replica.restarts += 1
                replica.restart_at, replica.exit_code, replica.kill_at = None, None, None
                self._allocs.pop(replica.id, None)
                self._sched_needed = True
                replica.node, replica.gpus, replica.handle = None, (), None
                self._replica_to(replica, ReplicaState.PENDING, "restart", now, d.message,
                                 restarts=replica.restarts, restart_at=None, exit_code=None, node=None, gpus=[],
                                 handle=None)
            elif isinstance(d, RequeueJob):
                # Its node is gone and it may not restart: requeue the whole job, as Slurm does
                # for a job whose node failed (same id, same names, same checkpoint directory).
                job.requeue_requested = True
                self.journal.job(job.id, requeue_requested_at=now)
                replica.ready = False
                self._replica_to(replica, ReplicaState.FAILED, "lost", now, d.message, ended_at=now,
                                 ready=False, handle=None)
                self._job_to(job, JobState.PREEMPTED, now, "node_lost", d.job_message)
                for other in job.members:
                    if not other.state.terminal and other.stop_requested_at is None:
                        self._stop_replica(job, other, "node_lost", now)
            elif isinstance(d, End):
                replica.ready = False
                self._replica_to(replica, d.state, d.cause, now, d.message, exit_code=d.exit_code, ended_at=now,
                                 ready=False, handle=None)
                self._dirty.add(job.id)
            else:  # pragma: no cover - a decision kind without an executor is a bug
                raise TypeError(f"no way to carry out {d!r}")

    def _set_ready(self, job: JobRec, replica: ReplicaRec, ready: bool, now: float, detail: str) -> None:
        replica.ready = ready
        self.journal.replica(replica.id, ready=ready)
        self.journal.event(job.id, now, replica.label, "ready" if ready else "not_ready", message=detail)
        self._publish.add(job.id)
        if startorder.waiting(job):
            self._launch_check.add(job.id)

    def _signal_replica(self, job: JobRec, replica: ReplicaRec, cause: str, now: float, message: str,
                        signame: str | None = None, grace: float | None = -1.0) -> bool:
        """Send a signal (the task's stop signal by default) and, unless ``grace`` is None
        (a warning), arm SIGKILL after the grace period (the task's by default)."""
        handle = replica.handle
        service = job.task(replica.task).service
        signame = signame or service.stop_signal
        if handle is None or not self.executor_of(replica).signal(handle, signal_number(signame)):
            return False
        if grace is None:
            self.journal.event(job.id, now, replica.label, cause, message=message)
            return True
        grace = service.grace_period if grace < 0 else grace
        replica.kill_at = now + grace
        self.journal.replica(replica.id, kill_at=replica.kill_at)
        heapq.heappush(self._timers, (replica.kill_at, job.id))
        self.journal.event(job.id, now, replica.label, cause,
                           message=f"{message}; {signame} sent, SIGKILL after {grace:g}s")
        return True

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
            now_placed = {t.name for t in job.stage()}  # a pipeline's later stages wait their turn
            for r in job.replicas:
                if r.state != ReplicaState.PENDING or r.task not in now_placed:
                    continue
                task = job.task(r.task)
                limit = job.time_limit_of(task)
                if limit is not None and job.started_at is not None:
                    limit = max(1.0, limit - (now - job.started_at))
                out.append(PendingJob(-r.id, (TaskRequest(task.name, 1, task.gpus, task.cpus, task.memory,
                                                          task.gpu_type),),
                                      job.submitted_at, job.user, job.account, limit, job.nice, job.partition,
                                      job.qos, job.priority, (), job.name, owner=job.id))
        return out

    def _place_growth(self, replica_id: int, alloc: Allocation, now: float) -> None:
        for job in self.active.values():
            replica = next((r for r in job.replicas if r.id == replica_id), None)
            if replica is not None and replica.state == ReplicaState.PENDING:
                self._place(job, replica, Allocation(replica.task, replica.rank, alloc.node, alloc.gpus, alloc.cpus,
                                                     alloc.memory), now)
                self._launch_check.add(job.id)
                return
