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
STARTING rows are committed, and only once: every attempt has its own key, committed before
it launches, and recovery asks each executor to adopt the attempts the store knows of; an
attempt the executor finds no trace of (ABSENT) is launched again under a new key.

Replicas run on executors (``corral.executors``): the node a replica is placed on names its
infra (local processes, a Ray cluster), and the loop speaks to that executor only through
the v2 contract: handles it stores but never reads, and events it drains each cycle."""

from __future__ import annotations

import heapq
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from corral.control.accounting import Ledger
from corral.control.retention import Housekeeper, Retention
from corral.control.journal import Journal
from corral.control.lifecycle import evaluate
from corral.control import startorder
from corral.control.records import JobRec, ReplicaRec, TaskRec, alternatives_of, load_records, record_of
from corral.control.provisioning import ProvisioningMixin
from corral.control.scheduling import SchedulingMixin
from corral.control.services import ServicesMixin
from corral.control.supervisor import AttemptEnded
from corral import executors as executor_registry
from corral.executors.contract import Binding, Executor, Kind, Launch, LaunchError, Observed
from corral.pool import NodeSpec
from corral.runtime import batchenv as slurmjob
from corral.runtime.environment import ReplicaContext, replica_env
from corral.scheduler import (Allocation, NodeView, Policy, Reason, priorities, schedule)
from corral.scheduler.applier import apply_starts
from corral.scheduler.placement import FreePool
from corral.scheduler.priority import CALC_PERIOD_S, Factors
from corral.metrics import Metrics
from corral.settings import Settings
from corral.site import Site
from corral.states import JobState, ReplicaState, check_job_transition, check_replica_transition
from corral.store.tables import Job

log = logging.getLogger("corral.control")

ARRIVAL_SPACING = 4.0  # a pass for new jobs alone waits 4x the last pass's cost: scheduling <= ~20% of the loop

_JOBS = Job.__table__
_CLAIM = (update(_JOBS).where(_JOBS.c.id.in_(bindparam("ids", expanding=True)), _JOBS.c.state == JobState.PENDING.value,
                              _JOBS.c.cancel_requested_at.is_(None), _JOBS.c.hold == "")
          .values(state=JobState.STARTING.value, reason="None", version=_JOBS.c.version + 1).returning(_JOBS.c.id))


def node_views(nodes: list[NodeSpec]) -> tuple[NodeView, ...]:
    return tuple(NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, tuple(sorted(n.labels.items())))
                 for n in nodes)


class Controller(SchedulingMixin, ServicesMixin, ProvisioningMixin):
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], site: Site,
                 clock: Callable[[], float] = time.time, write_lock: threading.RLock | None = None):
        self.settings = settings
        self.sessions = sessions
        self.site = site
        self.clock = clock
        self.policy: Policy = site.policy
        w = site.usage_weights
        self.ledger = Ledger(site.half_life_s, w.gpu, w.cpu, w.memory)
        self.priorities: dict[int, Factors] = {}  # of pending jobs, as of the last cycle
        self.hungry: frozenset[tuple[str, str]] = frozenset()  # short of their share, as of the last cycle
        # pending job -> the start its backfill reservation plans (squeue --start), as of the last pass
        self.expected_starts: dict[int, float] = {}
        self._priorities_at = 0.0
        self._ended_states: dict[int, str] = {}  # dependency targets that ended (never change again)
        # One writer at a time in this process: waiting on a Python lock wakes at once, where
        # SQLite's busy handler would sleep in 1–100 ms steps.
        self.write_lock = write_lock or threading.RLock()
        self._wake = threading.Event()
        self.executors: dict[str, Executor] = executor_registry.build(settings, site, self._wake_soon)
        self.nodes: list[NodeSpec] = []
        self.views: tuple[NodeView, ...] = ()
        self.node_infra: dict[str, str] = {}
        self.down_nodes: dict[str, NodeSpec] = {}  # nodes an executor reported once and lost since
        self._inventory_versions: tuple[int, ...] | None = None
        self.refresh_inventory()
        self.journal = Journal()
        self.pending: dict[int, JobRec] = {}  # queue order = id order
        self.active: dict[int, JobRec] = {}  # STARTING or RUNNING
        self._reasons: dict[int, str] = {}
        self._engine_waiting: set[int] = set()
        self.down_infra: dict[str, str] = {}  # a DOWN node -> the infra it was on  # pending jobs whose Slurm allocation does not run yet
        self._allocs: dict[int, Allocation] = {}  # replica id -> resources it holds
        self._by_key: dict[str, tuple[int, int]] = {}  # attempt key -> (job id, replica id)
        self._forget: list[tuple[str, dict]] = []  # (infra, handle) of ends made durable this cycle
        self._inbox: deque[tuple[str, object]] = deque()  # from API threads: new jobs, cancels
        self._next_rescan = 0.0
        # The scheduler runs when something it reads changed (a job queued, resources freed,
        # a job ended), and at least every ``refresh`` seconds while jobs wait (age, usage,
        # topology waits drift slowly): on events, coalesced, not every cycle.
        self._sched_needed = True
        self._sched_refresh_at = 0.0
        # New jobs alone do not call for a pass over the whole queue at once: while a flood of
        # submissions arrives, passes are spaced by a multiple of what the last one cost, so
        # scheduling a long queue takes at most about a fifth of the loop's time (with a
        # short queue a pass costs microseconds and nothing waits).
        self._arrivals = False
        self._sched_cost = 0.0
        self._sched_done_at = 0.0
        self._dirty: set[int] = set()
        self._cancels_seen: set[int] = set()
        self._timers: list[tuple[float, int]] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.metrics = Metrics()
        r = site.retention
        self.housekeeper = Housekeeper(settings, sessions, Retention(r.logs, r.checkpoints,
                                                                      max(1, int(r.max_log_size * 2**30))),
                                       self._live_logs, clock)
        self.failing_cycles = 0  # in a row; /v1/health reports a loop that keeps failing
        self.last_error: str | None = None
        self._init_services()

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="corral-control", daemon=True)
        self._thread.start()
        self.housekeeper.start()

    def stop(self) -> None:
        """Stop the loop; running replicas keep running and are adopted on the next start."""
        self._stopping.set()
        self._wake.set()
        self.housekeeper.stop()
        if self._thread:
            self._thread.join(timeout=10)
        with self.write_lock, self.sessions() as s:  # keep the usage accrued since the last flush
            self.ledger.flush(s, self.clock(), force=True)
            s.commit()
        self.prober.close()
        if self.balancer is not None:
            self.balancer.stop()
        for executor in self.executors.values():
            executor.close()

    def notify(self) -> None:
        self._wake.set()

    def submitted(self, job: Job) -> None:
        """Hand a just-committed job to the loop (saves it a query); the periodic rescan of
        the store would find it anyway."""
        if job.hold:  # submitted held: it joins the queue when released
            return
        self._inbox.append(("submitted", record_of(job)))
        self._wake.set()

    def cancel_requested(self, job_id: int) -> None:
        self._inbox.append(("cancel", job_id))
        self._wake.set()

    def scale_requested(self, job_id: int, task: str, count: int) -> None:
        self._inbox.append(("scale", (job_id, task, count)))
        self._wake.set()

    def hold_changed(self, job_id: int, held: bool) -> None:
        """A pending job was held (it leaves the queue at once) or released (it joins it)."""
        self._inbox.append(("hold" if held else "release", job_id))
        self._wake.set()

    def priority_changed(self, job_id: int) -> None:
        """A pending job's priority or nice changed: it is read back into the queue."""
        self._inbox.append(("reprioritize", job_id))
        self._wake.set()

    def requeue_requested(self, job_id: int) -> None:
        self._inbox.append(("requeue", job_id))
        self._wake.set()

    def _loop(self) -> None:
        last = 0.0
        while not self._stopping.is_set():
            timeout = self.settings.poll_interval_s
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - self.clock()))
            if self._arrivals:  # new jobs wait for a spaced pass (see _arrivals)
                timeout = max(0.0, min(timeout, self._next_arrival_pass() - time.monotonic()))
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
                self.failing_cycles, self.last_error = 0, None
            except Exception as exc:  # the loop must outlive one bad cycle; the next one retries
                log.exception("control cycle failed")
                self.failing_cycles += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                time.sleep(0.2)

    def _live_logs(self) -> list[str]:
        """Logs replicas are writing now (read by the housekeeper's thread: works on copies)."""
        out = []
        for job in list(self.active.values()):
            for replica in list(job.replicas):
                if replica.state == ReplicaState.RUNNING:
                    out.append(self.executor_of(replica).log_path(job.id, replica.label))
        return out

    def _wake_soon(self) -> None:  # executor threads: something was observed
        self._wake.set()

    # -- nodes --------------------------------------------------------------------------
    def refresh_inventory(self) -> bool:
        """Take the executors' node lists when any changed (a Ray node joined or left); a
        node that disappears is DOWN: nothing new is placed on it."""
        versions = tuple(e.inventory_version for e in self.executors.values())
        if versions == self._inventory_versions:
            return False
        self._inventory_versions = versions
        nodes, infra = [], {}
        for name, executor in self.executors.items():
            for node in executor.nodes():
                if node.name not in infra:
                    nodes.append(node)
                    infra[node.name] = name
        for old in self.nodes:
            if old.name not in infra and "corral.job" not in old.labels:  # an allocation's nodes leave with it
                self.down_nodes[old.name] = old
                self.down_infra[old.name] = self.node_infra.get(old.name, "local")
        for node in nodes:
            self.down_nodes.pop(node.name, None)
        self.nodes, self.node_infra, self.views = nodes, infra, node_views(nodes)
        self.site.nodes[:] = nodes  # admission checks requests against the live pool
        self._sched_needed = True
        return True

    def executor_of(self, replica: ReplicaRec) -> Executor:
        return self.executors[replica.infra or self.node_infra.get(replica.node or "", "local")]

    def cycle(self) -> None:
        self.cycles += 1
        with self.write_lock, self.sessions() as s:
            now = self.clock()  # after the lock: an API write that held it is never stamped later than this cycle
            cancels: list[int] = []
            requeues: list[int] = []
            while self._inbox:
                kind, item = self._inbox.popleft()
                if kind == "submitted":
                    self._enqueue(item)  # type: ignore[arg-type]
                elif kind == "scale":
                    job_id, task, count = item  # type: ignore[misc]
                    if job_id in self.active:
                        self._reconcile_scale(s, self.active[job_id], task, count, now)
                elif kind == "hold":
                    self._reasons.pop(item, None)  # type: ignore[arg-type]  # shown again once released
                    if self.pending.pop(item, None) is not None:  # type: ignore[arg-type]
                        self._sched_needed = True
                elif kind == "release":
                    self._next_rescan = 0.0  # read back into the queue just below
                elif kind == "reprioritize":  # read back, with its new priority, just below
                    self.pending.pop(item, None)  # type: ignore[arg-type]
                    self._next_rescan = 0.0
                    self._sched_needed = True
                elif kind == "requeue":
                    requeues.append(item)  # type: ignore[arg-type]
                else:
                    cancels.append(item)  # type: ignore[arg-type]
            if time.monotonic() >= self._next_rescan:
                # The safety net: anything the inbox did not bring (another writer of the
                # store, ids committed out of order on PostgreSQL) is found here.
                self._next_rescan = time.monotonic() + self.settings.rescan_interval_s
                self._ingest(s)
                cancels += self._requested_cancels(s)
                requeues += self._requested_requeues(s)
            self.refresh_inventory()
            self.ledger.accrue(now, self._holdings())
            self._collect_observed(now)
            self._collect_probe_results(now)
            self._collect_cancels(s, cancels, now)
            self._collect_requeues(s, requeues, now)
            while self._timers and self._timers[0][0] <= now:
                self._dirty.add(heapq.heappop(self._timers)[1])
            dirty, self._dirty = self._dirty, set()
            for job_id in sorted(dirty):
                job = self.active.get(job_id)
                try:
                    self._evaluate(job_id, now)
                except Exception as exc:  # isolate the job, keep the loop going for the rest
                    log.exception("evaluating job %s failed; failing it", job_id)
                    self._quarantine(job, exc, now)
            self._schedule(s, now)
            self._provision(s, now)  # 5a. jobs that wait for an engine's allocation (Slurm) ask for it
            self._commit(s)  # STARTING is durable before any process exists
            self._forget_ended()  # ends are durable too: an engine may free what they held
            self._launch_ready(now)
            self.ledger.flush(s, now)
            self._commit(s)
        self._publish_marked(now)
        if self._endpoint_jobs:  # routing needs no store; an endpoint opened on a new port is journalled
            with self.write_lock:
                self._sync_endpoints(now)
                if self.journal:
                    with self.sessions() as s:
                        self._commit(s)
        if self._dirty or self._launch_check:  # work found while working: look again at once
            self._wake.set()

    def _commit(self, s: Session) -> None:
        if self.journal:
            self.journal.flush(s)
        s.commit()

    # -- 1. ingest ----------------------------------------------------------------------
    def _enqueue(self, job: JobRec) -> None:
        if job.id in self.pending or job.id in self.active or job.state != JobState.PENDING or job.hold:
            return
        problem = _unusable(job, self.policy)
        if problem is not None:  # one bad job must not stop the loop for everyone
            now = self.clock()
            self._job_to(job, JobState.FAILED, now, "invalid", problem, reason="InvalidSpec", message=problem)
            for replica in job.replicas:
                if not replica.state.terminal:
                    self._replica_to(replica, ReplicaState.KILLED, "invalid", now, ended_at=now)
            return
        self._arrivals = True
        in_order = not self.pending or job.id > next(reversed(self.pending))
        self.pending[job.id] = job
        if not in_order:
            self.pending = dict(sorted(self.pending.items()))

    def _ingest(self, s: Session) -> None:
        ids = set(s.scalars(select(Job.id).where(Job.state == JobState.PENDING.value,
                                                 Job.cancel_requested_at.is_(None), Job.hold == "")))
        for gone in set(self.pending) - ids:
            self.pending.pop(gone, None)
        new = sorted(ids - set(self.pending))
        try:
            loaded = load_records(s, new) if new else {}
        except Exception:  # a row the loop cannot even read: load one by one, fail the bad ones
            loaded = {}
            for job_id in new:
                try:
                    loaded.update(load_records(s, [job_id]))
                except Exception as exc:
                    log.exception("job %s cannot be loaded; failing it", job_id)
                    self._fail_unreadable(s, job_id, f"{type(exc).__name__}: {exc}")
        for job in loaded.values():
            self._enqueue(job)

    def _fail_unreadable(self, s: Session, job_id: int, why: str) -> None:
        now = self.clock()
        message = f"corral cannot read this job ({why[:300]})"
        self.journal.job(job_id, state=JobState.FAILED.value, ended_at=now, reason="InvalidSpec", message=message)
        self.journal.event(job_id, now, "job", "invalid", JobState.PENDING.value, JobState.FAILED.value, message)

    # -- 2. what executors observed ----------------------------------------------------
    def _collect_observed(self, now: float) -> None:
        for infra, executor in list(self.executors.items()):
            for event in executor.drain():
                try:
                    self._observed(infra, event, now)
                except Exception as exc:  # one job's surprise must not stop the loop for all
                    log.exception("handling %s of %s failed; failing its job", event.kind.value, event.key)
                    job_id, _ = self._by_key.get(event.key, (None, None))
                    if job_id is None:
                        try:
                            job_id = int(event.key.split(".", 1)[0])
                        except ValueError:
                            continue
                    self._quarantine(self.active.get(job_id), exc, now)

    def _observed(self, infra: str, event: Observed, now: float) -> None:
        job_id, replica_id = self._by_key.get(event.key, (None, None))
        job = self.active.get(job_id)
        replica = next((r for r in job.replicas if r.id == replica_id), None) if job is not None else None
        if replica is None or replica.launch_key != event.key:
            if event.handle is not None and event.kind != Kind.ABSENT:
                self.executors[infra].signal(event.handle, signal.SIGKILL)  # nobody's attempt: never alive twice
            return
        if event.kind == Kind.STARTED:  # a start the engine confirmed late, or adopted after a restart
            launched = bool(replica.handle and replica.handle.get("pending"))
            replica.handle, replica.infra = event.handle, infra
            columns: dict[str, object] = {"handle": event.handle, "infra": infra}
            if replica.state == ReplicaState.STARTING:
                self._running(job, replica, event.handle, now, "launched" if launched else "adopted",
                              None if launched else "running after a server restart")
                return
            else:
                self.journal.replica(replica.id, **columns)
                self.journal.event(job.id, now, replica.label, "adopted", message="running after a server restart")
            if replica.kill_at is not None:
                heapq.heappush(self._timers, (replica.kill_at, job.id))
            self._watch_probes(job, replica)
            self._arm(job, replica)
            return
        self._by_key.pop(event.key, None)
        if event.kind == Kind.ABSENT:
            if replica.state == ReplicaState.STARTING:
                # Never ran: a fresh attempt, under a new key committed before it launches.
                replica.handle, replica.attempt = None, replica.attempt + 1
                self.journal.replica(replica.id, handle=None, attempt=replica.attempt)
                self._launch_check.add(job.id)
                return
            event = Observed(event.key, Kind.LOST, reason=event.reason, node=event.node)
        self._forget_probes(event.key)
        handle, replica.handle = replica.handle, None
        if handle is not None:
            self._forget.append((infra, handle))
        if replica.state.terminal:
            return
        self._publish.add(job.id)
        if startorder.waiting(job):
            self._launch_check.add(job.id)  # a task may wait for this one to succeed
        self._dirty.add(job.id)
        lost = event.kind == Kind.LOST
        if lost and event.node:
            self.refresh_inventory()  # the node may have left with it: never restart there
        ended = AttemptEnded(replica.id, event.code if event.kind == Kind.EXITED else None, lost, event.reason,
                             replica.node in self.node_infra)
        self._apply(job, self.supervisor.attempt_ended(job, replica, ended, now), now)

    def _quarantine(self, job: JobRec | None, exc: Exception, now: float) -> None:
        """A job the loop cannot handle: end its attempts (whole trees) and fail it, written
        straight to the journal (its in-memory state is not to be trusted)."""
        if job is None:
            return
        job_id = job.id
        self.active.pop(job_id, None)
        self.pending.pop(job_id, None)
        why = f"internal error: {type(exc).__name__}: {exc}"[:500]
        for replica in job.replicas:
            if replica.handle is not None:
                try:
                    self.executor_of(replica).signal(replica.handle, signal.SIGKILL)
                except Exception:
                    log.exception("could not kill %s of job %s", replica.label, job_id)
                self._by_key.pop(replica.launch_key, None)
            if self._allocs.pop(replica.id, None) is not None:
                self._sched_needed = True
            if not replica.state.terminal:
                self.journal.replica(replica.id, state=ReplicaState.KILLED.value, ended_at=now, handle=None)
        self.journal.job(job_id, state=JobState.FAILED.value, ended_at=now, message=why)
        self.journal.event(job_id, now, "job", "internal_error", job.state.value, JobState.FAILED.value, why)
        self._publish.discard(job_id)
        self._release_job(job)

    def _forget_ended(self) -> None:
        """Executors drop an attempt's records only once its end is committed."""
        forget, self._forget = self._forget, []
        for infra, handle in forget:
            try:
                self.executors[infra].forget(handle)
            except Exception:  # bookkeeping only: never fail a cycle over it
                log.exception("forgetting an attempt failed")

    # -- 3. cancels ---------------------------------------------------------------------
    def _requested_cancels(self, s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.cancel_requested_at.is_not(None),
            Job.state.in_([JobState.PENDING.value, JobState.STARTING.value, JobState.RUNNING.value]))))

    def _requested_requeues(self, s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.requeue_requested_at.is_not(None),
            Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value]))))

    def _collect_requeues(self, s: Session, job_ids: list[int], now: float) -> None:
        """A requeue asked for: the job stops as if preempted (every replica gets its stop
        signal and grace period) and, once all have stopped, is pending again under the same
        id, names and checkpoint directory. The wish is in the store, so a restart mid-stop
        still requeues it."""
        for job_id in job_ids:
            job = self.active.get(job_id)
            if job is None or job.state not in (JobState.STARTING, JobState.RUNNING) or job.cancel_requested:
                continue
            job.requeue_requested = True
            job.hold = s.scalar(select(Job.hold).where(Job.id == job.id)) or ""  # requeue --hold
            self._job_to(job, JobState.PREEMPTED, now, "requeue", "requeue requested: stopping every replica"
                         + (" (then held)" if job.hold else ""))
            for replica in job.members:
                if not replica.state.terminal and replica.stop_requested_at is None:
                    self._stop_replica(job, replica, "requeued", now)
            self._dirty.add(job.id)

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
        self._apply(job, self.supervisor.review(job, now, lambda node: node in self.node_infra), now)
        if job.state == JobState.PREEMPTED:
            self._finish_preemption(job, now)
            return
        if job.pipeline and self._next_stage(job, now):
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
            self._release_job(job)

    def _stop_replica(self, job: JobRec, replica: ReplicaRec, cause: str, now: float) -> None:
        replica.stop_requested_at, replica.stop_cause = now, cause
        self.journal.replica(replica.id, stop_requested_at=now, stop_cause=cause)
        if replica.handle is None:  # nothing runs for it (waiting, or between restarts)
            self._replica_to(replica, ReplicaState.KILLED, cause, now, ended_at=now, ready=False)
            self._publish.add(job.id)
            self._dirty.add(job.id)  # the job may be over now: look again at once, not at the next timer
        else:
            self._signal_replica(job, replica, cause, now, "stop requested")
        # if the signal found the process gone, its exit report is on its way

    # -- 5. schedule (the snapshot and preemption live in scheduling.py) -----------------
    def _schedule(self, s: Session, now: float) -> None:
        growth = self._growth_requests(now)
        if not self.pending and not growth:
            self.priorities = {}
            self.expected_starts = {}
            return
        clock = time.monotonic()
        if not self._sched_needed and clock < self._sched_refresh_at and not (
                self._arrivals and clock >= self._next_arrival_pass()):
            return
        self._sched_needed = self._arrivals = False
        self._sched_refresh_at = clock + self.settings.rescan_interval_s
        # Priorities are recomputed for every pending job every few seconds (age and usage
        # drift slowly; Slurm's PriorityCalcPeriod is 5 min); in between only new jobs are scored.
        if time.monotonic() >= self._priorities_at:
            self._priorities_at = time.monotonic() + CALC_PERIOD_S
            self.priorities = {}
        snapshot = self.snapshot(growth)
        plan = schedule(snapshot, now, self.policy)
        self.priorities = plan.priorities or priorities(snapshot, now, self.policy)
        self.hungry = plan.hungry
        # a start after a job without a time limit is unknown (infinite): not shown
        self.expected_starts = {j: t for j, t in plan.reserved_starts.items() if j > 0 and math.isfinite(t)}
        # the one applier (the simulator's too) re-checks every start, a gang all or none
        accepted, stale = apply_starts(FreePool(snapshot.nodes), plan)
        self._sched_done_at = time.monotonic()
        self._sched_cost = self._sched_done_at - clock
        self.metrics.cycle.observe(self._sched_cost)
        for start in stale:
            log.warning("rejected a stale start of job %s; it is retried next cycle", start.job_id)
        starts = []
        for start in accepted:
            if start.job_id < 0:  # a replica of a running job, placed like any job: limits hold
                self._place_growth(-start.job_id, start.allocations[0], now)
                continue
            starts.append(start)
        if self.journal:
            self.journal.flush(s)  # a job requeued this cycle is PENDING in the store before its claim
        claimed = self._claim(s, [start.job_id for start in starts])
        self.metrics.placements.observe(len(claimed))
        if stale or len(claimed) < len(starts):
            self._sched_needed = True  # a stale or lost start: look again next cycle
        for start in starts:
            job = self.pending.pop(start.job_id)
            self._reasons.pop(job.id, None)
            if job.id in claimed:
                factors = self.priorities.get(job.id)
                job.rank_priority = factors.total if factors is not None else 0.0
                self._admit(job, start.allocations, now, start.choice)
        for preemption in plan.preemptions:
            if preemption.for_job > 0:  # elastic growth never preempts: it waits for free resources
                self._preempt(s, preemption, now)
        for job_id, why in plan.cancels.items():
            job = self.pending.pop(job_id, None)
            if job is not None:
                self._job_to(job, JobState.CANCELLED, now, "dependency", why, reason=Reason.DEPENDENCY_NEVER.value,
                             message=why)
                for replica in job.replicas:
                    self._replica_to(replica, ReplicaState.KILLED, "dependency", now, ended_at=now)
        for job_id, reason in plan.reasons.items():
            if job_id in plan.cancels or job_id < 0 or job_id in self._engine_waiting:
                continue  # (a job waiting in Slurm's queue shows Slurm's reason)
            if self._reasons.get(job_id) != reason.value:
                self._reasons[job_id] = reason.value
                self.journal.job(job_id, reason=reason.value)

    def _next_arrival_pass(self) -> float:
        return self._sched_done_at + ARRIVAL_SPACING * self._sched_cost

    def _claim(self, s: Session, job_ids: list[int]) -> set[int]:
        """Compare-and-swap PENDING → STARTING for a whole plan in one statement; a job
        cancelled (or changed) since the snapshot is not returned and does not start."""
        if not job_ids:
            return set()
        return set(s.connection().execute(_CLAIM, {"ids": job_ids}).scalars())

    def _admit(self, job: JobRec, allocations: tuple[Allocation, ...], now: float,
               choice: tuple[int, ...] = ()) -> None:
        job.state = JobState.STARTING
        self.active[job.id] = job
        chosen = self._choose(job, choice)
        self.journal.event(job.id, now, "job", "scheduled", JobState.PENDING.value, JobState.STARTING.value,
                           f"placed {len(allocations)} replica(s) on {', '.join(sorted({a.node for a in allocations}))}"
                           + (f" with {chosen}" if chosen else ""))
        by_slot = {(a.task, a.rank): a for a in allocations}
        for task in job.stage():
            first = by_slot.get((task.name, 0)) or allocations[0]
            task.master_port = self._executor_for_node(first.node).rendezvous_port(first.node)
            self.journal.task(task.id, master_port=task.master_port)
        for replica in job.members:  # not replicas retired by a scale-down (or a requeue at initial size)
            if job.pipeline and (replica.task, replica.rank) not in by_slot:
                continue  # a stage still to come (or one done)
            self._place(job, replica, by_slot[(replica.task, replica.rank)], now)
        self._launch_check.add(job.id)

    def _choose(self, job: JobRec, choice: tuple[int, ...]) -> str:
        """Record the resource alternative each task starts with (what status shows and what a
        restart or growth of it asks for); a description of the choices, "" when none."""
        said = []
        for task, index in zip(job.tasks, choice):
            options = alternatives_of(task.service)
            if not options:
                continue
            task.gpus, task.cpus, task.memory, task.gpu_type = options[index]
            self.journal.task(task.id, gpus=task.gpus, cpus=task.cpus, memory=task.memory, gpu_type=task.gpu_type)
            what = f"{task.gpu_type}:{task.gpus}" if task.gpu_type else f"{task.gpus} GPU(s)"
            said.append(f"{task.name} on {what} (alternative {index + 1} of {len(options)})")
        return "; ".join(said)

    def _next_stage(self, job: JobRec, now: float) -> bool:
        """A pipeline whose current stage has just succeeded, with stages to come: it gives
        back what the stage held and waits in the queue for the next stage's resources (same
        id, names and checkpoint directory)."""
        if job.state != JobState.RUNNING or job.cancel_requested:
            return False
        current = job.stage()[0]
        if current is job.tasks[0] or any(r.state != ReplicaState.PENDING for r in job.replicas_of(current.name)):
            return False  # still in its first stage, or the stage has started
        for replica in job.members:
            self._allocs.pop(replica.id, None)
        self.active.pop(job.id)
        self._publish.discard(job.id)
        self._release_job(job)
        job.forget_request()
        position = job.tasks.index(current)
        self._job_to(job, JobState.PENDING, now, "next_stage",
                     f"stage {position} of {len(job.tasks)} done; stage {position + 1} ({current.name}) waits "
                     "for its resources", reason="None")
        self._sched_needed = True
        self._enqueue(job)
        return True

    def _executor_for_node(self, node: str) -> Executor:
        return self.executors[self.node_infra.get(node, "local")]

    def _place(self, job: JobRec, replica: ReplicaRec, alloc: Allocation, now: float) -> None:
        """Bind a replica to its allocation: the executor of the node gives its address and
        ports; a new attempt key is committed with STARTING, before anything launches."""
        infra = self.node_infra.get(alloc.node, "local")
        executor = self.executors[infra]
        previous = None
        if replica.addr and replica.node == alloc.node and replica.ports is not None:
            previous = Binding(replica.addr, dict(replica.ports))
        binding = executor.bind(job.id, replica.id, alloc.node, job.task(replica.task).service.ports, previous)
        replica.node, replica.gpus, replica.cpus, replica.memory = alloc.node, alloc.gpus, alloc.cpus, alloc.memory
        replica.addr, replica.ports, replica.infra = binding.addr, dict(binding.ports), infra
        replica.attempt += 1
        replica.handle = None
        prepare = getattr(executor, "prepare", None)  # optional: get ready for the start (local: its cgroup)
        if prepare is not None:
            prepare(replica.launch_key)
        self._allocs[replica.id] = alloc
        self._replica_to(replica, ReplicaState.STARTING, "scheduled", now, node=alloc.node,
                         gpus=list(alloc.gpus), cpus=alloc.cpus, memory=alloc.memory, addr=replica.addr,
                         ports=replica.ports, infra=infra, attempt=replica.attempt, handle=None)

    def _launch_ready(self, now: float) -> None:
        """Launch every placed replica whose start order allows it (after the commit that
        made its STARTING state and attempt key durable)."""
        checks, self._launch_check = self._launch_check, set()
        for job_id in sorted(checks):
            job = self.active.get(job_id)
            replicas = startorder.launchable(job) if job is not None else []
            if replicas:  # the files exist, and show these replicas, before any of them runs
                self._publish_job(job, now, launching=frozenset(r.id for r in replicas))
                self._launch(job, replicas, now)

    def _reserve(self, job: JobRec, replicas: list[ReplicaRec]) -> str | None:
        """Hold the replicas' resources in each engine's own accounting, a gang at a time,
        before any starts; the error when an engine refuses."""
        by_infra: dict[str, list[ReplicaRec]] = {}
        for replica in replicas:
            by_infra.setdefault(replica.infra or "local", []).append(replica)
        for infra, group in by_infra.items():
            slots = [(r.label, r.node or "", tuple(r.gpus), r.cpus, r.memory) for r in group]
            try:
                self.executors[infra].reserve(job.id, job.requeues, slots)
            except LaunchError as exc:
                return str(exc)
        return None

    def _launch(self, job: JobRec, replicas: list[ReplicaRec], now: float) -> None:
        refused = self._reserve(job, replicas)
        for replica in replicas:
            executor = self.executor_of(replica)
            try:
                launch = self._launch_for(job, replica)
                if refused is not None:
                    raise LaunchError(refused)
                handle = executor.start(launch)
            except Exception as exc:  # any failure ends the attempt and frees what it held
                message = str(exc) if isinstance(exc, LaunchError) else f"{type(exc).__name__}: {exc}"
                self._replica_to(replica, ReplicaState.FAILED, "launch_failed", now, message, ended_at=now)
                self._dirty.add(job.id)
                self._publish.add(job.id)
                continue
            self._by_key[launch.key] = (job.id, replica.id)
            replica.handle = handle
            if handle.get("pending"):  # the engine confirms the start later (a STARTED event)
                self.journal.replica(replica.id, handle=handle)
                continue
            self._running(job, replica, handle, now, "launched", None, launch)
        if startorder.waiting(job):
            self._launch_check.add(job.id)  # others may wait for these to start
        self._wake.set()  # launch failures and instant exits are handled next cycle

    def _running(self, job: JobRec, replica: ReplicaRec, handle: dict, now: float, cause: str,
                 message: str | None, launch: Launch | None = None) -> None:
        """An attempt's process runs: RUNNING, with the GPUs the engine bound, its probes and
        time limit armed; the job is RUNNING once none of its replicas is still starting."""
        executor = self.executor_of(replica)
        columns: dict[str, object] = {}
        if handle.get("gpus") is not None and tuple(handle["gpus"]) != tuple(replica.gpus):
            # the engine bound these GPUs (Ray picks indices itself): show and account those
            replica.gpus = tuple(int(g) for g in handle["gpus"])
            alloc = self._allocs.get(replica.id)
            if alloc is not None:
                self._allocs[replica.id] = Allocation(alloc.task, alloc.rank, alloc.node, replica.gpus,
                                                      alloc.cpus, alloc.memory)
            columns["gpus"] = list(replica.gpus)
        replica.handle = handle
        replica.started_at = replica.started_at if cause == "adopted" and replica.started_at else now
        replica.ready = job.task(replica.task).service.readiness_probe is None
        self._arm(job, replica)
        where = f"pid {handle['pid']} " if handle.get("pid") else ""
        self._replica_to(replica, ReplicaState.RUNNING, cause, now,
                         message or f"{where}on {replica.node} at {replica.addr} (attempt {replica.attempt})",
                         handle=handle, started_at=replica.started_at,
                         log_path=executor.log_path(job.id, replica.label), ready=replica.ready, kill_at=None,
                         infra=replica.infra, **columns)
        if launch is not None:
            self._watch_probes(job, replica, launch.env, launch.cwd)
        else:
            self._watch_probes(job, replica)
        if startorder.waiting(job):
            self._launch_check.add(job.id)
        if launch is None:  # confirmed late or adopted: peers see it running now
            self._publish.add(job.id)
        if job.state == JobState.STARTING and all(r.state != ReplicaState.STARTING for r in job.replicas):
            job.state = JobState.RUNNING
            job.started_at = job.started_at or now  # a pipeline's later stages keep its first start
            self.journal.job(job.id, state=JobState.RUNNING.value, started_at=job.started_at)
            self.journal.event(job.id, now, "job", "launched", JobState.STARTING.value, JobState.RUNNING.value)
            self.metrics.start_latency.observe(max(0.0, now - job.submitted_at))

    def _launch_for(self, job: JobRec, replica: ReplicaRec) -> Launch:
        task = job.task(replica.task)
        executor = self.executor_of(replica)
        checkpoint = self.settings.checkpoints_dir / str(job.id) / replica.task
        if executor.name in ("local", "slurm"):  # here, or on the filesystem Slurm's nodes share
            checkpoint.mkdir(parents=True, exist_ok=True)
        envs = {**task.spec.get("envs", {}), **task.spec.get("secrets", {})}
        peers = job.replicas_of(replica.task)
        master = next((r for r in peers if r.rank == 0), replica)
        ctx = ReplicaContext(
            job_id=job.id, job_name=job.name, is_group=job.is_group, task=replica.task, rank=replica.rank,
            num_replicas=task.num_nodes, node=replica.node or "",
            node_ips=tuple(r.addr or "127.0.0.1" for r in peers),
            addr=replica.addr or "127.0.0.1", gpus=replica.gpus, gpus_per_replica=task.gpus, cpus=task.cpus,
            master_port=task.master_port or 0, checkpoint_dir=str(checkpoint), restart_count=replica.restarts,
            user=job.user, task_envs=tuple(sorted(envs.items())), master_addr=master.addr or "")
        env = replica_env({}, ctx)
        env.update(executor.attempt_env(job.id))
        for name, port in (replica.ports or task.service.ports).items():
            env[f"CORRAL_PORT_{name.upper()}"] = str(port)
        env["CORRAL_LAUNCH_KEY"] = replica.launch_key
        if task.service.sbatch is not None and task.service.sbatch.role == "batch":
            env.update(self._batch_env(job, task, replica, executor.name))
        workdir = task.spec.get("workdir")
        repo = (workdir["url"], workdir.get("ref")) if isinstance(workdir, dict) else None
        return Launch(key=replica.launch_key, job_id=job.id, label=replica.label, node=replica.node or "",
                      gpus=tuple(replica.gpus), cpus=replica.cpus, memory=replica.memory,
                      setup=task.spec.get("setup"), run=task.spec.get("run"), env=env,
                      cwd=None if repo else workdir, repo=repo)

    def _batch_env(self, job: JobRec, task: TaskRec, replica: ReplicaRec, infra: str) -> dict[str, str]:
        """A Slurm batch script's variables and its nodes (``corral.runtime.batchenv``): its own
        node first, then those the job's other replicas hold."""
        holders = [replica] + [r for r in job.members if r.id != replica.id and r.node]
        nodes = tuple(slurmjob.NodeSlot(r.node or "", tuple(r.gpus), r.cpus, r.addr or "") for r in holders)
        ctx = slurmjob.BatchContext(job.id, job.name, job.user, job.partition, job.account, job.qos,
                                    job.time_limit_of(task), job.requeues, job.array_job_id, job.array_index, nodes,
                                    str(task.spec.get("workdir") or task.service.sbatch.submit_dir))
        shims = None
        if infra not in slurmjob.SLURM_EXECUTORS:
            shims = slurmjob.ensure_shims(self.settings.runtime_dir / "slurm-bin")
        keep = tuple({**task.spec.get("envs", {}), **task.spec.get("secrets", {})})
        return slurmjob.batch_env(task.service.sbatch, ctx, infra, shims, keep)

    def _release_job(self, job: JobRec) -> None:
        """The job ended: engines give back its reservations and drop its runtime files."""
        for executor in self.executors.values():
            try:
                executor.release(job.id)
                executor.cleanup_job(job.id)
            except Exception:
                log.exception("releasing job %s on %s failed", job.id, executor.name)
        self.refresh_inventory()  # nodes that left with it (a Slurm allocation) are not placed on again

    # -- recovery -----------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild memory from the store after a (re)start: each executor adopts the
        attempts the store knows of (alive ones are watched again, ones that ended while the
        server was down report their exits, ones that never started are launched anew under
        a new key), and kill and restart deadlines are re-armed."""
        now = self.clock()
        with self.write_lock, self.sessions() as s:
            ids = list(s.scalars(select(Job.id).where(Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value,
                                                                      JobState.PREEMPTED.value]))))
            self.active = load_records(s, ids)
            self.ledger.load(s, now)
            adopt: dict[str, list[tuple[str, dict | None]]] = {}
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
                    infra = replica.infra or self.node_infra.get(replica.node, "local")
                    replica.infra = infra
                    self._by_key[replica.launch_key] = (job.id, replica.id)
                    adopt.setdefault(infra, []).append((replica.launch_key, replica.handle))
            for job in self.active.values():  # scale requests that were not carried out yet
                for task in job.tasks:
                    if task.num_nodes != len(job.replicas_of(task.name)):
                        self._reconcile_scale(s, job, task.name, task.num_nodes, now)
            self._commit(s)
            for infra, attempts in adopt.items():
                executor = self.executors.get(infra)
                if executor is None:  # the site no longer has this infra: its attempts are lost
                    gone = self.executors.setdefault("_gone", _Gone())
                    for key, _ in attempts:
                        gone.lost(key, f"infra {infra!r} is not configured any more")
                    continue
                executor.adopt(attempts)  # reported before it returns: the first cycle sees all of it
        self._wake.set()

    # -- state changes ------------------------------------------------------------------
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


def _unusable(job: JobRec, policy: Policy) -> str | None:
    """Why the loop could not schedule or run this job (a row stored by an older version, or
    written around the API), or None."""
    try:
        job.request  # noqa: B018 - builds and validates what the scheduler reads
        for task in job.tasks:
            task.service  # noqa: B018
            for key in ("setup", "run", "workdir"):
                value = task.spec.get(key)
                if key == "workdir" and isinstance(value, dict):  # a repository: its URL is what runs
                    value = value.get("url")
                if value is not None and (not isinstance(value, str) or "\0" in value):
                    return f"task {task.name!r}: {key} cannot be run (not text, or holds a NUL byte)"
    except Exception as exc:
        return f"invalid stored job: {type(exc).__name__}: {str(exc)[:300]}"
    return None


class _Gone:
    """Stands in for an infra the site dropped while attempts ran on it: reports them lost."""

    name = "gone"
    inventory_version = 0

    def __init__(self) -> None:
        self._events: list[Observed] = []

    def lost(self, key: str, reason: str) -> None:
        self._events.append(Observed(key, Kind.LOST, reason=reason))

    def nodes(self) -> list[NodeSpec]:
        return []

    def drain(self) -> list[Observed]:
        out, self._events = self._events, []
        return out

    def signal(self, handle, signum) -> bool:
        return False

    def forget(self, handle) -> None:
        return None

    def release(self, job_id: int) -> None:
        return None

    def cleanup_job(self, job_id: int) -> None:
        return None

    def close(self) -> None:
        return None
