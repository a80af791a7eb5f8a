"""The control loop: the imperative shell around the pure scheduler and lifecycle rules.

One thread owns every state change. It sleeps until something happens (a submission, a
cancel, a replica exit, a deadline) and then runs one coalesced cycle:

  1. ingest    — newly pending jobs join the in-memory queue;
  2. exits     — replica exits reported by the executor are recorded, resources freed;
  3. cancels   — cancel requests stop pending jobs at once and active ones with grace;
  4. lifecycle — jobs touched by 1–3 or by a due timer are evaluated (pure) and the
                 decisions applied: stop replicas, set termination deadlines, end jobs;
  5. schedule  — ``schedule(snapshot, now, policy)`` gives a plan; each start is re-checked
                 against free resources and committed with a compare-and-swap on the job's
                 state (PENDING → STARTING), then its replicas are launched.

Replicas are launched only after the STARTING row is committed, and only once: recovery
adopts processes by pid *and* start time (or finds them by their launch key in /proc)
before it ever launches a STARTING replica again."""

from __future__ import annotations

import heapq
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from corral.control.lifecycle import JobView, ReplicaView, TaskView, evaluate
from corral.executors.base import Handle, Launch
from corral.executors.local import LocalExecutor
from corral.pool import NodeSpec
from corral.runtime.environment import ReplicaContext, replica_env
from corral.scheduler import Allocation, NodeView, PendingJob, Policy, Snapshot, TaskRequest, schedule
from corral.scheduler.placement import FreePool
from corral.settings import Settings
from corral.states import JobState, ReplicaState, check_job_transition, check_replica_transition
from corral.store.repository import add_event, load_job
from corral.store.tables import Job, Replica

log = logging.getLogger("corral.control")

LIVE_REPLICA_STATES = (ReplicaState.STARTING.value, ReplicaState.RUNNING.value)


def pending_request(job: Job) -> PendingJob:
    return PendingJob(job.id, tuple(TaskRequest(t.name, t.num_nodes, t.gpus, t.cpus, t.memory, t.gpu_type)
                                    for t in job.tasks), job.submitted_at, job.user)


def node_views(nodes: list[NodeSpec]) -> tuple[NodeView, ...]:
    return tuple(NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, tuple(sorted(n.labels.items())))
                 for n in nodes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Controller:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], nodes: list[NodeSpec],
                 clock: Callable[[], float] = time.time, policy: Policy = Policy()):
        self.settings = settings
        self.sessions = sessions
        self.nodes = nodes
        self.views = node_views(nodes)
        self.clock = clock
        self.policy = policy
        self.executor = LocalExecutor(self._on_exit)
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "SKYPILOT_", "SLURM_"))}
        self._exits: deque[tuple[Handle, int | None]] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: dict[int, PendingJob] = {}
        self._reasons: dict[int, str] = {}
        self._allocs: dict[int, Allocation] = {}  # replica id -> allocation held
        self._handles: dict[int, Handle] = {}  # replica id -> running process
        self._by_key: dict[str, int] = {}  # launch key -> replica id
        self._dirty: set[int] = set()
        self._cancels_seen: set[int] = set()
        self._timers: list[tuple[float, int]] = []
        self.cycles = 0

    # -- lifecycle of the loop ----------------------------------------------------------
    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="corral-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; running replicas keep running and are adopted on the next start."""
        self._stopping.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.executor.close()

    def notify(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            now = self.clock()
            timeout = self.settings.poll_interval_s
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - now))
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self.cycle()
            except Exception:  # the loop must outlive one bad cycle; the next one retries
                log.exception("control cycle failed")
                time.sleep(0.2)

    def _on_exit(self, handle: Handle, code: int | None) -> None:
        self._exits.append((handle, code))
        self._wake.set()

    # -- one cycle ----------------------------------------------------------------------
    def cycle(self) -> None:
        self.cycles += 1
        now = self.clock()
        with self.sessions() as s:
            self._ingest(s)
            self._collect_exits(s, now)
            self._collect_cancels(s, now)
            self._fire_timers(now)
            for job_id in sorted(self._dirty):
                self._evaluate(s, job_id, now)
            self._dirty.clear()
            s.commit()
            self._schedule(s, now)

    def _ingest(self, s: Session) -> None:
        # All pending ids every cycle (cheap): ids may commit out of order on PostgreSQL.
        ids = set(s.scalars(select(Job.id).where(Job.state == JobState.PENDING.value,
                                                 Job.cancel_requested_at.is_(None))).all())
        for gone in set(self._pending) - ids:
            self._pending.pop(gone, None)
        new = sorted(ids - set(self._pending))
        for chunk in range(0, len(new), 500):
            for job in s.scalars(select(Job).where(Job.id.in_(new[chunk:chunk + 500]))).all():
                self._pending[job.id] = pending_request(job)
                self._reasons[job.id] = job.reason
        if new:
            self._pending = dict(sorted(self._pending.items()))

    def _collect_exits(self, s: Session, now: float) -> None:
        while self._exits:
            handle, code = self._exits.popleft()
            rid = self._by_key.pop(handle.key, None)
            if rid is None:
                continue
            self._handles.pop(rid, None)
            replica = s.get(Replica, rid)
            if replica is None or ReplicaState(replica.state).terminal:
                continue
            if replica.stop_requested_at is not None:
                new, cause = ReplicaState.KILLED, replica.stop_cause or "stopped"
            elif code == 0:
                new, cause = ReplicaState.SUCCEEDED, "exited"
            else:
                new, cause = ReplicaState.FAILED, "exited" if code is not None else "lost"
            message = (f"exit code {code}" if code is not None else
                       "the process ended while corral was down and left no exit code")
            self._replica_to(s, replica, new, cause, now, message)
            replica.exit_code = code
            replica.ended_at = now
            self._dirty.add(replica.job_id)

    def _collect_cancels(self, s: Session, now: float) -> None:
        rows = s.execute(select(Job.id, Job.state).where(Job.cancel_requested_at.is_not(None),
                                                          Job.state.in_([JobState.PENDING.value,
                                                                         JobState.STARTING.value,
                                                                         JobState.RUNNING.value]))).all()
        for job_id, state in rows:
            if job_id in self._cancels_seen:
                continue
            self._cancels_seen.add(job_id)
            if state == JobState.PENDING.value:
                self._pending.pop(job_id, None)
                job = load_job(s, job_id)
                if job is not None and self._cas_job(s, job, JobState.PENDING, JobState.CANCELLED, now, "cancel",
                                                     "cancelled while pending"):
                    job.ended_at = now
                    for replica in job.replicas:
                        self._replica_to(s, replica, ReplicaState.KILLED, "cancel", now)
            else:
                self._dirty.add(job_id)

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, job_id = heapq.heappop(self._timers)
            self._dirty.add(job_id)

    def _timer(self, at: float, job_id: int) -> None:
        heapq.heappush(self._timers, (at, job_id))

    # -- lifecycle decisions --------------------------------------------------------------
    def _evaluate(self, s: Session, job_id: int, now: float) -> None:
        job = load_job(s, job_id)
        if job is None or JobState(job.state).terminal:
            return
        for replica in job.replicas:  # grace periods that ran out
            if replica.kill_at is not None and replica.kill_at <= now and replica.id in self._handles:
                if self.executor.signal(self._handles[replica.id], signal.SIGKILL):
                    add_event(s, job.id, now, replica.label, "killed", message="grace period over: SIGKILL")
                replica.kill_at = None
        view = JobView(job.id, JobState(job.state), job.cancel_requested_at is not None,
                       tuple(TaskView(t.name, t.primary, t.termination_delay, t.termination_deadline) for t in job.tasks),
                       tuple(ReplicaView(r.id, r.task, r.rank, ReplicaState(r.state), r.exit_code,
                                         r.stop_requested_at is not None) for r in job.replicas))
        decisions = evaluate(view, now)
        tasks = {t.name: t for t in job.tasks}
        for d in decisions.deadlines:
            tasks[d.task].termination_deadline = d.deadline
            add_event(s, job.id, now, d.task, "termination_delay",
                      message=f"primaries done; stopping {d.task} in {d.deadline - now:.1f}s")
        replicas = {r.id: r for r in job.replicas}
        for stop in decisions.stops:
            self._stop_replica(s, job, replicas[stop.replica_id], tasks[replicas[stop.replica_id].task].grace_period,
                               stop.cause, now)
        if decisions.wake_at is not None:
            self._timer(decisions.wake_at, job.id)
        if decisions.end is not None:
            end = decisions.end
            if self._cas_job(s, job, JobState(job.state), end.state, now, end.cause, end.message):
                job.exit_code = end.exit_code
                job.ended_at = now
                job.message = end.message

    def _stop_replica(self, s: Session, job: Job, replica: Replica, grace: float, cause: str, now: float) -> None:
        replica.stop_requested_at = now
        replica.stop_cause = cause
        handle = self._handles.get(replica.id)
        if handle is not None and self.executor.signal(handle, signal.SIGTERM):
            replica.kill_at = now + grace
            self._timer(replica.kill_at, job.id)
            add_event(s, job.id, now, replica.label, cause, message=f"SIGTERM sent; SIGKILL after {grace:g}s")
        elif handle is None:  # nothing runs for it (never launched)
            self._release(replica.id)
            self._replica_to(s, replica, ReplicaState.KILLED, cause, now)
            replica.ended_at = now
        # else: the process already exited; its exit report is on its way

    # -- scheduling ----------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        pool = FreePool(self.views)
        for alloc in list(self._allocs.values()):  # read from API threads too
            pool.assume(alloc)
        nodes = tuple(NodeView(n.view.name, n.view.gpus, n.view.cpus, n.view.memory, n.view.gpu_type, n.view.labels,
                               frozenset(n.gpus), n.cpus, n.memory) for n in pool.nodes)
        return Snapshot(nodes, tuple(self._pending.values()))

    def _schedule(self, s: Session, now: float) -> None:
        if not self._pending:
            return
        snapshot = self.snapshot()
        plan = schedule(snapshot, now, self.policy)
        pool = FreePool(snapshot.nodes)
        for start in plan.starts:
            try:  # the applier re-checks every allocation before it commits anything
                for alloc in start.allocations:
                    pool.assume(alloc)
            except ValueError:
                log.warning("rejected a stale start of job %s; it is retried next cycle", start.job_id)
                continue
            self._pending.pop(start.job_id, None)
            self._reasons.pop(start.job_id, None)
            self._admit(s, start.job_id, start.allocations, now)
        for job_id, reason in plan.reasons.items():
            if self._reasons.get(job_id) != reason.value:
                self._reasons[job_id] = reason.value
                s.execute(update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value)
                          .values(reason=reason.value))
        s.commit()

    def _admit(self, s: Session, job_id: int, allocations: tuple[Allocation, ...], now: float) -> None:
        job = load_job(s, job_id)
        if job is None:
            return
        result = s.execute(update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value,
                                             Job.cancel_requested_at.is_(None))
                           .values(state=JobState.STARTING.value, reason="None", version=Job.version + 1))
        if result.rowcount != 1:  # cancelled or changed meanwhile: the plan is stale for it
            s.rollback()
            return
        s.refresh(job)
        add_event(s, job.id, now, "job", "scheduled", JobState.PENDING.value, JobState.STARTING.value,
                  f"placed {len(allocations)} replica(s) on {', '.join(sorted({a.node for a in allocations}))}")
        by_slot = {(a.task, a.rank): a for a in allocations}
        for task in job.tasks:
            task.master_port = free_port()
        for replica in job.replicas:
            alloc = by_slot[(replica.task, replica.rank)]
            replica.node, replica.gpus, replica.cpus, replica.memory = alloc.node, list(alloc.gpus), alloc.cpus, alloc.memory
            self._replica_to(s, replica, ReplicaState.STARTING, "scheduled", now)
            self._allocs[replica.id] = alloc
        s.commit()  # STARTING is durable before any process exists
        self._launch(s, job, [r for r in job.replicas], now)

    def _launch(self, s: Session, job: Job, replicas: list[Replica], now: float) -> None:
        tasks = {t.name: t for t in job.tasks}
        spec_tasks = {t["name"]: t for t in job.spec["tasks"]}
        for replica in replicas:
            task, spec = tasks[replica.task], spec_tasks[replica.task]
            launch = self._launch_for(job, task, spec, replica)
            try:
                handle = self.executor.start(launch)
            except OSError as exc:
                self._release(replica.id)
                self._replica_to(s, replica, ReplicaState.FAILED, "launch_failed", now, str(exc))
                replica.ended_at = now
                self._dirty.add(job.id)
                continue
            self._track(replica.id, handle)
            replica.pid, replica.pid_started_at = handle.pid, handle.started_at
            replica.started_at = now
            replica.log_path = str(launch.log_path)
            self._replica_to(s, replica, ReplicaState.RUNNING, "launched", now, f"pid {handle.pid} on {replica.node}")
            self.executor.watch(handle)
        if job.state == JobState.STARTING.value and \
                all(r.state != ReplicaState.STARTING.value for r in job.replicas):
            self._cas_job(s, job, JobState.STARTING, JobState.RUNNING, now, "launched")
            job.started_at = now
        s.commit()
        self._wake.set()  # launch failures and instant exits are handled next cycle

    def _launch_for(self, job: Job, task, spec: dict, replica: Replica) -> Launch:
        key = f"{job.id}.{replica.task}.{replica.rank}.r{replica.restarts}"
        checkpoint = self.settings.checkpoints_dir / str(job.id) / replica.task
        checkpoint.mkdir(parents=True, exist_ok=True)
        ctx = ReplicaContext(
            job_id=job.id, job_name=job.name, is_group=job.is_group, task=replica.task, rank=replica.rank,
            num_replicas=task.num_nodes, node=replica.node or "", node_ips=("127.0.0.1",) * task.num_nodes,
            addr="127.0.0.1", gpus=tuple(replica.gpus), gpus_per_replica=task.gpus, cpus=task.cpus,
            master_port=task.master_port or 0, checkpoint_dir=str(checkpoint), restart_count=replica.restarts,
            user=job.user, task_envs=tuple(sorted({**spec.get("envs", {}), **spec.get("secrets", {})}.items())))
        env = replica_env(self.base_env, ctx)
        env["CORRAL_LAUNCH_KEY"] = key
        return Launch(key=key, run_dir=self._run_dir(job.id, replica), log_path=self._log_path(job.id, replica),
                      setup=spec.get("setup"), run=spec.get("run"), env=env, cwd=spec.get("workdir"))

    def _run_dir(self, job_id: int, replica: Replica) -> Path:
        return self.settings.runs_dir / str(job_id) / f"{replica.task}-{replica.rank}"

    def _log_path(self, job_id: int, replica: Replica) -> Path:
        return self.settings.logs_dir / str(job_id) / f"{replica.task}-{replica.rank}.log"

    # -- recovery -------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild memory from the store after a (re)start: adopt live replicas, record exits
        that happened while the server was down, launch STARTING replicas that never ran."""
        now = self.clock()
        with self.sessions() as s:
            jobs = s.scalars(select(Job.id).where(Job.state.in_([JobState.STARTING.value,
                                                                  JobState.RUNNING.value]))).all()
            for job_id in jobs:
                job = load_job(s, job_id)
                unlaunched = []
                for replica in job.replicas:
                    if replica.state not in LIVE_REPLICA_STATES or replica.node is None:
                        continue
                    self._allocs[replica.id] = Allocation(replica.task, replica.rank, replica.node,
                                                          tuple(replica.gpus), replica.cpus, replica.memory)
                    key = f"{job.id}.{replica.task}.{replica.rank}.r{replica.restarts}"
                    if replica.pid is None:
                        found = find_launched(key)
                        if found is None and not (self._run_dir(job.id, replica) / "exit_code").exists():
                            unlaunched.append(replica)
                            continue
                        replica.pid, replica.pid_started_at = found or (0, 0.0)
                        self._replica_to(s, replica, ReplicaState.RUNNING, "adopted", now)
                    if replica.kill_at is not None:
                        self._timer(replica.kill_at, job.id)
                    handle = Handle(key, replica.pid, replica.pid_started_at or 0.0, self._run_dir(job.id, replica))
                    self._track(replica.id, handle)
                    add_event(s, job.id, now, replica.label, "adopted", message=f"pid {replica.pid} after restart")
                self._dirty.add(job.id)
                s.commit()
                for replica in self._handles_of(job):
                    self.executor.watch(replica)
                if unlaunched:
                    self._launch(s, job, unlaunched, now)
        self._wake.set()

    def _handles_of(self, job: Job) -> list[Handle]:
        return [self._handles[r.id] for r in job.replicas if r.id in self._handles]

    # -- small helpers ---------------------------------------------------------------------
    def _track(self, replica_id: int, handle: Handle) -> None:
        self._handles[replica_id] = handle
        self._by_key[handle.key] = replica_id

    def _release(self, replica_id: int) -> None:
        self._allocs.pop(replica_id, None)

    def _replica_to(self, s: Session, replica: Replica, new: ReplicaState, cause: str, now: float,
                    message: str | None = None) -> None:
        old = ReplicaState(replica.state)
        if old == new:
            return
        check_replica_transition(old, new)
        replica.state = new.value
        if new.terminal:
            self._release(replica.id)
        add_event(s, replica.job_id, now, replica.label, cause, old.value, new.value, message)

    def _cas_job(self, s: Session, job: Job, old: JobState, new: JobState, now: float, cause: str,
                 message: str | None = None) -> bool:
        check_job_transition(old, new)
        result = s.execute(update(Job).where(Job.id == job.id, Job.state == old.value)
                           .values(state=new.value, version=Job.version + 1,
                                   reason="None" if new != JobState.PENDING else job.reason))
        if result.rowcount != 1:
            return False
        job.state = new.value
        add_event(s, job.id, now, "job", cause, old.value, new.value, message)
        return True


def find_launched(key: str) -> tuple[int, float] | None:
    """A process of ours that carries this launch key, if one exists (the window between
    spawning a replica and recording its pid)."""
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if proc.environ().get("CORRAL_LAUNCH_KEY") == key and proc.pid == os.getpgid(proc.pid):
                return proc.pid, proc.info["create_time"]
        except (psutil.Error, OSError):
            continue
    return None
