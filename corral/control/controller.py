"""The control loop: the imperative shell around the pure scheduler and lifecycle rules.

One thread owns every state change. It sleeps until something happens (a submission, a
cancel, a replica exit, a deadline) and then runs one coalesced cycle:

  1. ingest    — newly pending jobs are loaded (in bulk) into memory;
  2. exits     — replica exits reported by the executor are recorded, resources freed;
  3. cancels   — cancel requests end pending jobs at once and stop active ones with grace;
  4. lifecycle — jobs touched by 1–3 or by a due timer are evaluated (pure) and the
                 decisions applied: stop replicas, set termination deadlines, end jobs;
  5. schedule  — ``schedule(snapshot, now, policy)`` gives a plan; each start is re-checked
                 against free resources and claimed with a compare-and-swap on the job's
                 state (PENDING → STARTING); the claims are committed, then replicas launch.

State lives in memory (``records``) and every change is written through a ``Journal`` that
is flushed and committed at the end of each phase. Replicas are launched only after their
STARTING rows are committed, and only once: recovery adopts processes by pid *and* start
time (or finds them by their launch key in /proc) before it launches a STARTING replica."""

from __future__ import annotations

import heapq
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil
from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from corral.control.accounting import Ledger
from corral.control.journal import Journal
from corral.control.lifecycle import evaluate
from corral.control import startorder
from corral.control.records import JobRec, ReplicaRec, load_records, record_of
from corral.control.scheduling import SchedulingMixin
from corral.control.services import ServicesMixin
from corral.executors.base import Executor, Handle, Launch
from corral.executors.local import EXIT_FILE, LocalExecutor
from corral.pool import NodeSpec
from corral.runtime.discovery import loopback_address
from corral.runtime.environment import ReplicaContext, replica_env
from corral.scheduler import (Allocation, NodeView, Policy, Reason, priorities, schedule)
from corral.scheduler.placement import FreePool
from corral.scheduler.priority import CALC_PERIOD_S, Factors
from corral.settings import Settings
from corral.site import Site
from corral.states import JobState, ReplicaState, check_job_transition, check_replica_transition
from corral.store.tables import Job

log = logging.getLogger("corral.control")

_JOBS = Job.__table__
_CLAIM = (update(_JOBS).where(_JOBS.c.id.in_(bindparam("ids", expanding=True)), _JOBS.c.state == JobState.PENDING.value,
                              _JOBS.c.cancel_requested_at.is_(None))
          .values(state=JobState.STARTING.value, reason="None", version=_JOBS.c.version + 1).returning(_JOBS.c.id))


def node_views(nodes: list[NodeSpec]) -> tuple[NodeView, ...]:
    return tuple(NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, tuple(sorted(n.labels.items())))
                 for n in nodes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Controller(SchedulingMixin, ServicesMixin):
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], site: Site,
                 clock: Callable[[], float] = time.time, write_lock: threading.RLock | None = None):
        self.settings = settings
        self.sessions = sessions
        self.site = site
        self.nodes = site.nodes
        self.views = node_views(site.nodes)
        self.clock = clock
        self.policy: Policy = site.policy
        w = site.usage_weights
        self.ledger = Ledger(site.half_life_s, w.gpu, w.cpu, w.memory)
        self.priorities: dict[int, Factors] = {}  # of pending jobs, as of the last cycle
        self.hungry: frozenset[tuple[str, str]] = frozenset()  # short of their share, as of the last cycle
        self._priorities_at = 0.0
        self._ended_states: dict[int, str] = {}  # dependency targets that ended (never change again)
        # One writer at a time in this process: waiting on a Python lock wakes at once, where
        # SQLite's busy handler would sleep in 1–100 ms steps.
        self.write_lock = write_lock or threading.RLock()
        self.executor: Executor = LocalExecutor(self._on_exit)
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "SKYPILOT_", "SLURM_"))}
        self.journal = Journal()
        self.pending: dict[int, JobRec] = {}  # queue order = id order
        self.active: dict[int, JobRec] = {}  # STARTING or RUNNING
        self._reasons: dict[int, str] = {}
        self._allocs: dict[int, Allocation] = {}  # replica id -> resources it holds
        self._handles: dict[int, Handle] = {}  # replica id -> its process
        self._by_key: dict[str, tuple[int, int]] = {}  # launch key -> (job id, replica id)
        self._exits: deque[tuple[Handle, int | None]] = deque()
        self._inbox: deque[tuple[str, object]] = deque()  # from API threads: new jobs, cancels
        self._next_rescan = 0.0
        # The scheduler runs when something it reads changed (a job queued, resources freed,
        # a job ended), and at least every ``refresh`` seconds while jobs wait (age, usage,
        # topology waits drift slowly): on events, coalesced, not every cycle.
        self._sched_needed = True
        self._sched_refresh_at = 0.0
        self._dirty: set[int] = set()
        self._cancels_seen: set[int] = set()
        self._timers: list[tuple[float, int]] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self._init_services()

    # -- the loop ------------------------------------------------------------------------
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
        with self.write_lock, self.sessions() as s:  # keep the usage accrued since the last flush
            self.ledger.flush(s, self.clock(), force=True)
            s.commit()
        self.prober.close()
        self.executor.close()

    def notify(self) -> None:
        self._wake.set()

    def submitted(self, job: Job) -> None:
        """Hand a just-committed job to the loop (saves it a query); the periodic rescan of
        the store would find it anyway."""
        self._inbox.append(("submitted", record_of(job)))
        self._wake.set()

    def cancel_requested(self, job_id: int) -> None:
        self._inbox.append(("cancel", job_id))
        self._wake.set()

    def scale_requested(self, job_id: int, task: str, count: int) -> None:
        self._inbox.append(("scale", (job_id, task, count)))
        self._wake.set()

    def _loop(self) -> None:
        last = 0.0
        while not self._stopping.is_set():
            timeout = self.settings.poll_interval_s
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - self.clock()))
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping.is_set():
                break
            # Coalesce bursts (many submits, many exits) into one cycle instead of one each.
            pause = last + self.settings.min_cycle_interval_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._wake.clear()
            last = time.monotonic()
            try:
                self.cycle()
            except Exception:  # the loop must outlive one bad cycle; the next one retries
                log.exception("control cycle failed")
                time.sleep(0.2)

    def _on_exit(self, handle: Handle, code: int | None) -> None:  # executor thread
        self._exits.append((handle, code))
        self._wake.set()

    def cycle(self) -> None:
        self.cycles += 1
        now = self.clock()
        with self.write_lock, self.sessions() as s:
            cancels: list[int] = []
            while self._inbox:
                kind, item = self._inbox.popleft()
                if kind == "submitted":
                    self._enqueue(item)  # type: ignore[arg-type]
                elif kind == "scale":
                    job_id, task, count = item  # type: ignore[misc]
                    if job_id in self.active:
                        self._reconcile_scale(s, self.active[job_id], task, count, now)
                else:
                    cancels.append(item)  # type: ignore[arg-type]
            if time.monotonic() >= self._next_rescan:
                # The safety net: anything the inbox did not bring (another writer of the
                # store, ids committed out of order on PostgreSQL) is found here.
                self._next_rescan = time.monotonic() + self.settings.rescan_interval_s
                self._ingest(s)
                cancels += self._requested_cancels(s)
            self.ledger.accrue(now, self._holdings())
            self._collect_exits(now)
            self._collect_probe_results(now)
            self._collect_cancels(s, cancels, now)
            while self._timers and self._timers[0][0] <= now:
                self._dirty.add(heapq.heappop(self._timers)[1])
            dirty, self._dirty = self._dirty, set()
            for job_id in sorted(dirty):
                self._evaluate(job_id, now)
            self._place_growth(now)
            self._schedule(s, now)
            self._commit(s)  # STARTING is durable before any process exists
            self._launch_ready(now)
            self.ledger.flush(s, now)
            self._commit(s)
        self._publish_marked(now)
        if self._dirty or self._launch_check:  # work found while working: look again at once
            self._wake.set()

    def _commit(self, s: Session) -> None:
        if self.journal:
            self.journal.flush(s)
        s.commit()

    # -- 1. ingest ----------------------------------------------------------------------
    def _enqueue(self, job: JobRec) -> None:
        if job.id in self.pending or job.id in self.active or job.state != JobState.PENDING:
            return
        self._sched_needed = True
        in_order = not self.pending or job.id > next(reversed(self.pending))
        self.pending[job.id] = job
        if not in_order:
            self.pending = dict(sorted(self.pending.items()))

    def _ingest(self, s: Session) -> None:
        ids = set(s.scalars(select(Job.id).where(Job.state == JobState.PENDING.value,
                                                 Job.cancel_requested_at.is_(None))))
        for gone in set(self.pending) - ids:
            self.pending.pop(gone, None)
        new = sorted(ids - set(self.pending))
        for job in load_records(s, new).values() if new else ():
            self._enqueue(job)

    # -- 2. exits -----------------------------------------------------------------------
    def _collect_exits(self, now: float) -> None:
        while self._exits:
            handle, code = self._exits.popleft()
            job_id, replica_id = self._by_key.pop(handle.key, (None, None))
            job = self.active.get(job_id)
            if job is None:
                continue
            self._handles.pop(replica_id, None)
            self._forget_probes(handle.key)
            replica = next(r for r in job.replicas if r.id == replica_id)
            if replica.state.terminal:
                continue
            self._publish.add(job.id)
            if startorder.waiting(job):
                self._launch_check.add(job.id)  # a task may wait for this one to succeed
            self._dirty.add(job.id)
            if replica.stop_requested_at is None and self._maybe_restart(job, replica, code, now):
                continue
            replica.ready = False
            if replica.stop_requested_at is not None:
                new, cause = ReplicaState.KILLED, replica.stop_cause or "stopped"
            elif code == 0:
                new, cause = ReplicaState.SUCCEEDED, "exited"
            else:
                new, cause = ReplicaState.FAILED, "exited" if code is not None else "lost"
            message = (f"exit code {code}" if code is not None else
                       "the process ended while corral was down and left no exit code")
            self._replica_to(replica, new, cause, now, message, exit_code=code, ended_at=now, ready=False)

    # -- 3. cancels ---------------------------------------------------------------------
    def _requested_cancels(self, s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.cancel_requested_at.is_not(None),
            Job.state.in_([JobState.PENDING.value, JobState.STARTING.value, JobState.RUNNING.value]))))

    def _collect_cancels(self, s: Session, job_ids: list[int], now: float) -> None:
        for job_id in job_ids:
            if job_id in self._cancels_seen:
                continue
            if job_id in self.active:
                self._cancels_seen.add(job_id)
                self.active[job_id].cancel_requested = True
                self._dirty.add(job_id)
                continue
            self.pending.pop(job_id, None)
            job = load_records(s, [job_id]).get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue  # not ours yet or already over; the rescan looks again
            self._cancels_seen.add(job_id)
            self._job_to(job, JobState.CANCELLED, now, "cancel", "cancelled while pending")
            for replica in job.replicas:
                self._replica_to(replica, ReplicaState.KILLED, "cancel", now, ended_at=now)

    # -- 4. lifecycle -------------------------------------------------------------------
    def _evaluate(self, job_id: int, now: float) -> None:
        job = self.active.get(job_id)
        if job is None:
            return
        self._start_due_restarts(job, now)
        self._fail_blocked(job, now)
        self._check_time_limits(job, now)
        for replica in job.replicas:  # grace periods that ran out
            if replica.kill_at is not None and replica.kill_at <= now and replica.id in self._handles:
                if self.executor.signal(self._handles[replica.id], signal.SIGKILL):
                    self.journal.event(job.id, now, replica.label, "killed", message="grace period over: SIGKILL")
                replica.kill_at = None
                self.journal.replica(replica.id, kill_at=None)
        if job.state == JobState.PREEMPTED:
            self._finish_preemption(job, now)
            return
        decisions = evaluate(job.view(), now)
        for d in decisions.deadlines:
            task = job.task(d.task)
            task.termination_deadline = d.deadline
            self.journal.task(task.id, termination_deadline=d.deadline)
            self.journal.event(job.id, now, d.task, "termination_delay",
                               message=f"primaries done; stopping {d.task} in {d.deadline - now:.1f}s")
        by_id = {r.id: r for r in job.replicas}
        for stop in decisions.stops:
            self._stop_replica(job, by_id[stop.replica_id], stop.cause, now)
        if decisions.wake_at is not None:
            heapq.heappush(self._timers, (decisions.wake_at, job.id))
        if decisions.end is not None:
            end = decisions.end
            self._job_to(job, end.state, now, end.cause, end.message, exit_code=end.exit_code, message=end.message)
            self.active.pop(job.id)
            self._publish.discard(job.id)
            shutil.rmtree(self._job_dir(job.id), ignore_errors=True)  # tmpfs is memory: free it

    def _stop_replica(self, job: JobRec, replica: ReplicaRec, cause: str, now: float) -> None:
        replica.stop_requested_at, replica.stop_cause = now, cause
        self.journal.replica(replica.id, stop_requested_at=now, stop_cause=cause)
        if self._handles.get(replica.id) is None:  # nothing runs for it (waiting, or between restarts)
            self._replica_to(replica, ReplicaState.KILLED, cause, now, ended_at=now, ready=False)
            self._publish.add(job.id)
        else:
            self._signal_replica(job, replica, cause, now, "stop requested")
        # if the signal found the process gone, its exit report is on its way

    # -- 5. schedule (the snapshot and preemption live in scheduling.py) -----------------
    def _schedule(self, s: Session, now: float) -> None:
        if not self.pending:
            self.priorities = {}
            return
        if not self._sched_needed and time.monotonic() < self._sched_refresh_at:
            return
        self._sched_needed = False
        self._sched_refresh_at = time.monotonic() + self.settings.rescan_interval_s
        # Priorities are recomputed for every pending job every few seconds (age and usage
        # drift slowly; Slurm's PriorityCalcPeriod is 5 min); in between only new jobs are scored.
        if time.monotonic() >= self._priorities_at:
            self._priorities_at = time.monotonic() + CALC_PERIOD_S
            self.priorities = {}
        snapshot = self.snapshot()
        plan = schedule(snapshot, now, self.policy)
        self.priorities = plan.priorities or priorities(snapshot, now, self.policy)
        self.hungry = plan.hungry
        pool = FreePool(snapshot.nodes)
        starts = []
        for start in plan.starts:
            try:  # the applier re-checks every allocation before it claims anything
                for alloc in start.allocations:
                    pool.assume(alloc)
            except ValueError:
                log.warning("rejected a stale start of job %s; it is retried next cycle", start.job_id)
                continue
            starts.append(start)
        if self.journal:
            self.journal.flush(s)  # a job requeued this cycle is PENDING in the store before its claim
        claimed = self._claim(s, [start.job_id for start in starts])
        if len(claimed) < len(plan.starts):
            self._sched_needed = True  # a stale or lost start: look again next cycle
        for start in starts:
            job = self.pending.pop(start.job_id)
            self._reasons.pop(job.id, None)
            if job.id in claimed:
                factors = self.priorities.get(job.id)
                job.rank_priority = factors.total if factors is not None else 0.0
                self._admit(job, start.allocations, now)
        for preemption in plan.preemptions:
            self._preempt(s, preemption, now)
        for job_id, why in plan.cancels.items():
            job = self.pending.pop(job_id, None)
            if job is not None:
                self._job_to(job, JobState.CANCELLED, now, "dependency", why, reason=Reason.DEPENDENCY_NEVER.value,
                             message=why)
                for replica in job.replicas:
                    self._replica_to(replica, ReplicaState.KILLED, "dependency", now, ended_at=now)
        for job_id, reason in plan.reasons.items():
            if job_id in plan.cancels:
                continue
            if self._reasons.get(job_id) != reason.value:
                self._reasons[job_id] = reason.value
                self.journal.job(job_id, reason=reason.value)

    def _claim(self, s: Session, job_ids: list[int]) -> set[int]:
        """Compare-and-swap PENDING → STARTING for a whole plan in one statement; a job
        cancelled (or changed) since the snapshot is not returned and does not start."""
        if not job_ids:
            return set()
        return set(s.connection().execute(_CLAIM, {"ids": job_ids}).scalars())

    def _admit(self, job: JobRec, allocations: tuple[Allocation, ...], now: float) -> None:
        job.state = JobState.STARTING
        self.active[job.id] = job
        self.journal.event(job.id, now, "job", "scheduled", JobState.PENDING.value, JobState.STARTING.value,
                           f"placed {len(allocations)} replica(s) on {', '.join(sorted({a.node for a in allocations}))}")
        for task in job.tasks:
            task.master_port = free_port()
            self.journal.task(task.id, master_port=task.master_port)
        by_slot = {(a.task, a.rank): a for a in allocations}
        for replica in job.replicas:
            alloc = by_slot[(replica.task, replica.rank)]
            replica.node, replica.gpus, replica.cpus, replica.memory = alloc.node, alloc.gpus, alloc.cpus, alloc.memory
            replica.addr = loopback_address(replica.id)
            self._allocs[replica.id] = alloc
            self._replica_to(replica, ReplicaState.STARTING, "scheduled", now, node=alloc.node,
                             gpus=list(alloc.gpus), cpus=alloc.cpus, memory=alloc.memory, addr=replica.addr)
        self._launch_check.add(job.id)

    def _launch_ready(self, now: float) -> None:
        """Launch every placed replica whose start order allows it (after the commit that
        made its STARTING state durable)."""
        checks, self._launch_check = self._launch_check, set()
        for job_id in sorted(checks):
            job = self.active.get(job_id)
            replicas = startorder.launchable(job) if job is not None else []
            if replicas:  # the files exist, and show these replicas, before any of them runs
                self._publish_job(job, now, launching=frozenset(r.id for r in replicas))
                self._launch(job, replicas, now)

    def _launch(self, job: JobRec, replicas: list[ReplicaRec], now: float) -> None:
        for replica in replicas:
            launch = self._launch_for(job, replica)
            try:
                handle = self.executor.start(launch)
            except OSError as exc:
                self._replica_to(replica, ReplicaState.FAILED, "launch_failed", now, str(exc), ended_at=now)
                self._dirty.add(job.id)
                self._publish.add(job.id)
                continue
            self._track(job, replica, handle)
            replica.pid, replica.pid_started_at, replica.started_at = handle.pid, handle.started_at, now
            replica.ready = job.task(replica.task).service.readiness_probe is None
            self._arm_time_limit(job, replica)
            self._replica_to(replica, ReplicaState.RUNNING, "launched", now,
                             f"pid {handle.pid} on {replica.node} at {replica.addr}",
                             pid=handle.pid, pid_started_at=handle.started_at, started_at=now,
                             log_path=str(launch.log_path), ready=replica.ready, kill_at=None)
            self._watch_probes(job, replica, launch.env, launch.cwd)
            self.executor.watch(handle)
        if startorder.waiting(job):
            self._launch_check.add(job.id)  # others may wait for these to start
        if job.state == JobState.STARTING and all(r.state != ReplicaState.STARTING for r in job.replicas):
            job.state = JobState.RUNNING
            job.started_at = now
            self.journal.job(job.id, state=JobState.RUNNING.value, started_at=now)
            self.journal.event(job.id, now, "job", "launched", JobState.STARTING.value, JobState.RUNNING.value)
        self._wake.set()  # launch failures and instant exits are handled next cycle

    def _launch_for(self, job: JobRec, replica: ReplicaRec) -> Launch:
        task = job.task(replica.task)
        checkpoint = self.settings.checkpoints_dir / str(job.id) / replica.task
        checkpoint.mkdir(parents=True, exist_ok=True)
        envs = {**task.spec.get("envs", {}), **task.spec.get("secrets", {})}
        ctx = ReplicaContext(
            job_id=job.id, job_name=job.name, is_group=job.is_group, task=replica.task, rank=replica.rank,
            num_replicas=task.num_nodes, node=replica.node or "",
            node_ips=tuple(r.addr or "127.0.0.1" for r in job.replicas_of(replica.task)),
            addr=replica.addr or "127.0.0.1", gpus=replica.gpus, gpus_per_replica=task.gpus, cpus=task.cpus,
            master_port=task.master_port or 0, checkpoint_dir=str(checkpoint), restart_count=replica.restarts,
            user=job.user, task_envs=tuple(sorted(envs.items())))
        env = replica_env(self.base_env, ctx)
        env.update(self._discovery_env(job, replica))
        env["CORRAL_LAUNCH_KEY"] = replica.launch_key
        return Launch(key=replica.launch_key, run_dir=self._run_dir(replica), log_path=self._log_path(replica),
                      setup=task.spec.get("setup"), run=task.spec.get("run"), env=env, cwd=task.spec.get("workdir"))

    def _run_dir(self, replica: ReplicaRec) -> Path:
        return self.settings.runs_dir / str(replica.job_id) / replica.label

    def _log_path(self, replica: ReplicaRec) -> Path:
        return self.settings.logs_dir / str(replica.job_id) / f"{replica.label}.log"

    # -- recovery -----------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild memory from the store after a (re)start: adopt live replicas (and their
        probes), record exits that happened while the server was down, re-arm kill and
        restart deadlines. Replicas placed but never launched are launched by the next
        cycle once their start order allows, and only after a search for their launch key
        shows no process was started for them before the crash."""
        now = self.clock()
        with self.write_lock, self.sessions() as s:
            ids = list(s.scalars(select(Job.id).where(Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value,
                                                                      JobState.PREEMPTED.value]))))
            self.active = load_records(s, ids)
            self.ledger.load(s, now)
            to_watch: list[Handle] = []
            for job in self.active.values():
                self._dirty.add(job.id)
                self._launch_check.add(job.id)
                self._publish.add(job.id)
                for replica in job.replicas:
                    live = (ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.RESTARTING)
                    if replica.state not in live or replica.node is None:
                        continue
                    self._allocs[replica.id] = replica.allocation()
                    if replica.state == ReplicaState.RESTARTING:
                        heapq.heappush(self._timers, (replica.restart_at or now, job.id))
                        continue
                    if replica.pid is None:
                        found = find_launched(replica.launch_key)
                        if found is None and not (self._run_dir(replica) / EXIT_FILE).exists():
                            continue
                        replica.pid, replica.pid_started_at = found or (0, 0.0)
                        self._replica_to(replica, ReplicaState.RUNNING, "adopted", now, pid=replica.pid,
                                         pid_started_at=replica.pid_started_at)
                    if replica.kill_at is not None:
                        heapq.heappush(self._timers, (replica.kill_at, job.id))
                    handle = Handle(replica.launch_key, replica.pid, replica.pid_started_at or 0.0,
                                    self._run_dir(replica))
                    self._track(job, replica, handle)
                    to_watch.append(handle)
                    launch = self._launch_for(job, replica)
                    self._watch_probes(job, replica, launch.env, launch.cwd)
                    self._arm_time_limit(job, replica)
                    self.journal.event(job.id, now, replica.label, "adopted", message=f"pid {replica.pid} after restart")
            for job in self.active.values():  # scale requests that were not carried out yet
                for task in job.tasks:
                    if task.num_nodes != len(job.replicas_of(task.name)):
                        self._reconcile_scale(s, job, task.name, task.num_nodes, now)
            self._commit(s)
            for handle in to_watch:
                self.executor.watch(handle)  # an exit while we were down is reported at once
        self._wake.set()

    # -- state changes ------------------------------------------------------------------
    def _track(self, job: JobRec, replica: ReplicaRec, handle: Handle) -> None:
        self._handles[replica.id] = handle
        self._by_key[handle.key] = (job.id, replica.id)

    def _replica_to(self, replica: ReplicaRec, new: ReplicaState, cause: str, now: float,
                    message: str | None = None, **columns: object) -> None:
        old = replica.state
        check_replica_transition(old, new)
        replica.state = new
        if "exit_code" in columns:
            replica.exit_code = columns["exit_code"]  # type: ignore[assignment]
        if new.terminal:
            if self._allocs.pop(replica.id, None) is not None:
                self._sched_needed = True  # resources freed
        self.journal.replica(replica.id, state=new.value, **columns)
        self.journal.event(replica.job_id, now, replica.label, cause, old.value, new.value, message)

    def _job_to(self, job: JobRec, new: JobState, now: float, cause: str, event_message: str | None,
                **columns: object) -> None:
        """Move a job the loop owns (claimed, or pending and never claimed): only this thread
        writes job states, so the write goes through the journal like any other."""
        old = job.state
        check_job_transition(old, new)
        job.state = new
        values = {"state": new.value, **columns}
        if new.terminal:
            values["ended_at"] = now
            self._sched_needed = True  # jobs may depend on this one
        self.journal.job(job.id, **values)
        self.journal.event(job.id, now, "job", cause, old.value, new.value, event_message)


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
