"""The loop's scheduling step: the snapshot the pure scheduler reads (free resources, pending
jobs in queue order and replicas of running jobs waiting for a place, running jobs with
their expected ends and elastic surplus, usage, dependency states), the plan it returns, and
the plan carried out: every start re-checked by the one applier (shared with the simulator)
and claimed with a compare-and-swap on the job's state (PENDING → STARTING) for the whole
plan in one statement, preemptions and dependency cancels carried out, and every waiting
job's reason written where it changed.

Every pending job is given its run time learned from its user's history (``runtimes``);
with ``learn_durations`` on, the scheduler plans with it, and running jobs are planned to end
when the prediction they started with says (until they outlive it). A job that starts keeps
its prediction, in the store too.

The pass runs when something it reads changed, and at least every ``rescan_interval_s``
while jobs wait (age, usage and topology waits drift slowly). While a flood of submissions
arrives, passes for new jobs alone are spaced by a multiple of what the last one cost, so
scheduling a long queue takes at most about a fifth of the loop's time."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from corral.control.accounting import Holding, Ledger
from corral.control.book import Book
from corral.control.inventory import Inventory
from corral.control.placement import Placer
from corral.control.queue import Queue
from corral.control.records import JobRec, ReplicaRec
from corral.control.requeue import Requeues
from corral.control.runtimes import RunTimes
from corral.scheduler.durations import DurationModel
from corral.control.scaling import Scaling
from corral.control.transitions import Transitions
from corral.metrics import Metrics
from corral.store.tables import REASON_LENGTH
from corral.scheduler import (NodeView, PendingJob, Policy, RunningJob, Shrinkable, Snapshot, priorities, schedule)
from corral.scheduler.applier import apply_plan
from corral.scheduler.placement import FreePool, gang_shortage, port_shortage
from corral.scheduler.plan import Allocation, Reason
from corral.scheduler.priority import CALC_PERIOD_S, Factors
from corral.states import JobState, ReplicaState
from corral.store.tables import Job

log = logging.getLogger("corral.control")

ARRIVAL_SPACING = 4.0  # a pass for new jobs alone waits 4x the last pass's cost: scheduling <= ~20% of the loop

_JOBS = Job.__table__
_CLAIM = (update(_JOBS).where(_JOBS.c.id.in_(bindparam("ids", expanding=True)), _JOBS.c.state == JobState.PENDING.value,
                              _JOBS.c.cancel_requested_at.is_(None), _JOBS.c.hold == "")
          .values(state=JobState.STARTING.value, reason="None", version=_JOBS.c.version + 1).returning(_JOBS.c.id))


class Scheduling:
    def __init__(self, book: Book, moves: Transitions, inventory: Inventory, placer: Placer, queue: Queue,
                 requeues: Requeues, scaling: Scaling, ledger: Ledger, policy: Policy,
                 sessions: sessionmaker[Session], rescan_s: float, metrics: Metrics, runtimes: RunTimes | None = None):
        self.book, self.moves, self.inventory, self.placer = book, moves, inventory, placer
        self.runtimes = runtimes if runtimes is not None else RunTimes(policy.learn_durations,
                                                                      DurationModel(max_spread=policy.learn_spread))
        self.queue, self.requeues, self.scaling, self.ledger = queue, requeues, scaling, ledger
        self.policy, self.sessions, self.rescan_s, self.metrics = policy, sessions, rescan_s, metrics
        self.priorities: dict[int, Factors] = {}  # of pending jobs, as of the last pass
        self.hungry: frozenset[tuple[str, str]] = frozenset()  # short of their share, as of the last pass
        self.expected_starts: dict[int, float] = {}  # pending job -> its backfill reservation's start
        self._priorities_at = 0.0
        self._refresh_at = 0.0
        self._cost = 0.0
        self._done_at = 0.0

    # -- what the scheduler reads ---------------------------------------------------------------
    def free_views(self, placing: bool = False) -> tuple[NodeView, ...]:
        """What is free on every node up; ``placing``: only nodes the scheduler may place on
        (not those whose engine just did not answer for them)."""
        views = self.inventory.placeable() if placing else self.inventory.views
        releasing = self.requeues.carrier.effects.releasing() if placing else set()
        if releasing:
            # nodes provisioned for a job whose release this cycle queued (requeued, preempted,
            # on to its next stage) leave the pool once it is carried out, after the commit: a
            # job pending again must wait for new ones, not be placed on what is being given back
            views = tuple(v for v in views if v.dedicated_to not in releasing)
        pool = FreePool(views)
        up = self.inventory.node_infra
        for alloc in self.book.allocs.values():
            # a replica recorded on a node its executor does not report now (a server restarted
            # while Slurm or Ray does not answer): nothing is placed there; the executor says its fate
            if alloc.node in up and alloc.node in pool.by_name:
                pool.assume(alloc, ports=False)  # what runs holds its ports, whatever placed it
        return pool.views()

    def snapshot(self, now: float, growth: list[PendingJob] | None = None) -> Snapshot:
        pending = tuple(growth or ()) + tuple(self.runtimes.requests(self.book.pending.values()))
        for job_id in self.runtimes.rescored:  # its job-size factor plans with the new prediction
            self.priorities.pop(job_id, None)
        running = tuple(self._running_view(job, now) for job in self.book.active.values())
        return Snapshot(self.free_views(placing=True), pending, running, self.ledger.usage(), self.ledger.gpu_minutes(),
                        self._dependency_states(pending), priorities=dict(self.priorities) or None)

    def _running_view(self, job: JobRec, now: float) -> RunningJob:
        allocs = self.book.allocs
        live = [r for r in job.members if not r.state.terminal and r.id in allocs]
        ends = [job.started_at + limit for t in job.tasks
                if job.started_at is not None and (limit := job.time_limit_of(t)) is not None]
        elastic, growable = [], []
        for task in job.tasks:
            low = task.service.min_nodes
            mine = sorted((r for r in live if r.task == task.name and r.stop_requested_at is None), key=lambda r: r.rank)
            grows = task.service.grow
            if low is not None and len(mine) > low and len(mine) == len(job.replicas_of(task.name)):
                # what a growing task grew above its initial size is lent: anyone takes it back first
                lent = int(task.spec.get("num_nodes") or 1) if grows else None
                elastic.append(Shrinkable(task.name, low, tuple(allocs[r.id] for r in mine), lent))
            if grows and all(r.state in (ReplicaState.RUNNING, ReplicaState.STARTING) for r in mine):
                part = self.scaling.growable(job, task, mine, now)
                if part is not None:
                    growable.append(part)
        ending = job.state == JobState.PREEMPTED or job.cancel_requested or \
            any(t.termination_deadline is not None for t in job.tasks)
        stopping = tuple(allocs[r.id] for r in live if r.stop_requested_at is not None)
        end, limit_end = self.runtimes.planned_end(job, max(ends) if ends else float("inf"), now)
        return RunningJob(job.id, tuple(allocs[r.id] for r in live), end, job.user,
                          job.account, job.partition, job.qos, job.started_at or job.submitted_at, job.rank_priority,
                          ending, tuple(elastic), job.name, job.array_job_id, job.no_requeue, stopping,
                          limit_end=limit_end, preemptible=job.preemptible, restart_cost_s=job.restart_cost,
                          preempted=job.requeues, attained_gpu_s=job.attained_gpu_s,
                          growable=tuple(growable) if not ending else ())

    def _dependency_states(self, pending: tuple[PendingJob, ...]) -> dict[int, str]:
        wanted = {i for job in pending for dep in job.dependencies for i in dep.job_ids}
        if not wanted:
            return {}
        states: dict[int, str] = {}
        unknown = []
        for job_id in wanted:
            rec = self.book.active.get(job_id) or self.book.pending.get(job_id)
            if rec is not None:
                states[job_id] = rec.state.value
            elif job_id in self.book.ended_states:
                states[job_id] = self.book.ended_states[job_id]
            else:
                unknown.append(job_id)
        if unknown:
            with self.sessions() as s:
                for job_id, state in s.execute(select(Job.id, Job.state).where(Job.id.in_(unknown))):
                    states[job_id] = state
                    if JobState(state).terminal:
                        self.book.ended_states[job_id] = state
        return states

    def holdings(self) -> list[Holding]:
        out = []
        for job in self.book.active.values():
            for replica in job.replicas:
                alloc = self.book.allocs.get(replica.id)
                if alloc is not None and replica.state in (ReplicaState.RUNNING, ReplicaState.STARTING):
                    out.append(Holding(job.account or job.user, job.user, self.policy.qos_of(job.qos).name,
                                       len(alloc.gpus), alloc.cpus, alloc.memory))
        return out

    # -- the pass -------------------------------------------------------------------------------
    def next_arrival_pass(self) -> float:
        return self._done_at + ARRIVAL_SPACING * self._cost

    def run(self, s: Session, now: float, flush: Callable[[], None]) -> None:
        """One scheduling pass, when one is due; ``flush`` writes what the cycle journalled so
        far (a job requeued this cycle is PENDING in the store before its claim)."""
        book = self.book
        growth = self.scaling.requests(now)
        # a task that grows on its own into idle GPUs needs a pass even with nothing pending
        growing = self.policy.grow and any(t.service.grow and t.num_nodes < (t.service.max_nodes or 0)
                                           for job in book.active.values() for t in job.tasks)
        if not book.pending and not growth and not growing:
            self.priorities, self.expected_starts = {}, {}
            if self.runtimes.predictions:
                self.runtimes.requests(())
            return
        clock = time.monotonic()
        if not book.sched_needed and clock < self._refresh_at and not (
                self.queue.arrivals and clock >= self.next_arrival_pass()):
            return
        book.sched_needed = self.queue.arrivals = False
        self._refresh_at = clock + self.rescan_s
        # Priorities are recomputed for every pending job every few seconds (age and usage
        # drift slowly; Slurm's PriorityCalcPeriod is 5 min); in between only new jobs are scored.
        if clock >= self._priorities_at:
            self._priorities_at = clock + CALC_PERIOD_S
            self.priorities = {}
        snapshot = self.snapshot(now, growth)
        plan = schedule(snapshot, now, self.policy)
        self.priorities = plan.priorities or priorities(snapshot, now, self.policy)
        self.hungry = plan.hungry
        # a start after a job without a time limit is unknown (infinite): not shown
        self.expected_starts = {j: t for j, t in plan.reserved_starts.items() if j > 0 and math.isfinite(t)}
        # the one applier (the simulator's too) re-checks every start (a gang all or none),
        # every victim and shrink, every dependency cancel, against the state as it is now
        applied = apply_plan(FreePool(snapshot.nodes), plan, snapshot.running, self.policy, book.pending)
        accepted, stale = applied.accepted, applied.stale
        self._done_at = time.monotonic()
        self._cost = self._done_at - clock
        self.metrics.cycle.observe(self._cost)
        for start in stale:
            log.warning("rejected a stale start of job %s; it is retried next cycle", start.job_id)
        for refusal in applied.refused:
            log.info("not carried out: %s of job %s (%s)", refusal.kind, refusal.job_id, refusal.why)
        starts = []
        for start in accepted:
            if start.job_id < 0:  # a replica of a running job, placed like any job: limits hold
                self.scaling.place(-start.job_id, start.allocations, now)
                continue
            starts.append(start)
        flush()
        claimed = self._claim(s, [start.job_id for start in starts])
        self.metrics.placements.observe(len(claimed))
        if stale or len(claimed) < len(starts):
            book.sched_needed = True  # a stale or lost start: look again next cycle
        for start in starts:
            job = book.pending.pop(start.job_id)
            book.reasons.pop(job.id, None)
            if job.id in claimed:
                factors = self.priorities.get(job.id)
                job.rank_priority = factors.total if factors is not None else 0.0
                self.runtimes.started(job, self.moves.journal)
                self.placer.admit(job, start.allocations, now, start.choice)
        for eviction in applied.evictions:
            self.requeues.evict(eviction.job_id, eviction.mode, eviction.for_job, now, eviction.why)
        for downsize in applied.downsizes:
            self.requeues.shrink(s, downsize.job_id, downsize.task, downsize.replicas, downsize.for_job, now)
        for grow in applied.grown:  # elastic tasks growing on their own into what no one else could use
            self.scaling.grow(s, grow.job_id, grow.task, grow.replicas, grow.allocations, now)
        for cancel in applied.cancels:
            job = book.pending.pop(cancel.job_id, None)
            if job is not None:
                self.moves.kill_all(job, JobState.CANCELLED, now, "dependency", cancel.why,
                                    reason=Reason.DEPENDENCY_NEVER.value, message=cancel.why)
        # why a running job's waiting replicas wait (what a held request to its endpoint is told)
        book.growth_reasons = self.scaling.spread(
            {-job_id: reason.value for job_id, reason in plan.reasons.items() if job_id < 0})
        down = self.inventory.down_partitions
        for job_id, reason in plan.reasons.items():
            if job_id in plan.cancels or job_id < 0 or job_id in book.engine_waiting:
                continue  # (a job an engine provisions shows the engine's reason)
            job = book.pending.get(job_id)
            # a partition whose engine does not answer: that is why, whatever the plan saw
            said = Reason.PARTITION_DOWN.value if job is not None and job.partition in down else reason.value
            if book.reasons.get(job_id) != said:  # (the sentence behind it is looked for once, when it changes)
                self.set_reason(job_id, said, self._constraint(snapshot, job_id) if said == Reason.CONSTRAINT.value
                                else None)

    @staticmethod
    def _constraint(snapshot: Snapshot, job_id: int) -> str | None:
        """The sentence behind a BadConstraints reason where it is a port two replicas of the
        job would hold on one address of the nodes provisioned for it (a Slurm allocation), or
        a gang wider than the nodes that could hold one of its members."""
        job = next((j for j in snapshot.pending if j.id == job_id), None)
        if job is None:
            return None
        own = [n for n in snapshot.nodes if n.dedicated_to == job_id]
        why = port_shortage(own, job) if own else None  # (elsewhere submission refused it with this sentence)
        if why:
            return f"cannot start on the nodes provisioned for it: {why}"
        # a gang's members each on a node of their own, and the pool lost nodes since it was
        # admitted (or its running members hold the rest)
        why = gang_shortage(own or [n for n in snapshot.nodes if n.dedicated_to is None], job)
        return why and f"cannot start until more nodes join: {why}"

    def set_reason(self, job_id: int, reason: str, why: str | None = None) -> None:
        """The reason a job waits: the whole sentence in memory (the loop's view shows it), and
        as much as the store's column holds (an engine's own reason can be longer; PostgreSQL
        refuses a longer value, and a refused write would fail the whole cycle). ``why``, a
        sentence behind a short reason, becomes the job's message."""
        if self.book.reasons.get(job_id) != reason:
            self.book.reasons[job_id] = reason
            stored = reason if len(reason) <= REASON_LENGTH else reason[:REASON_LENGTH - 1] + "…"
            if why is not None:
                self.moves.journal.job(job_id, reason=stored, message=why)
            else:
                self.moves.journal.job(job_id, reason=stored)

    @staticmethod
    def _claim(s: Session, job_ids: list[int]) -> set[int]:
        """Compare-and-swap PENDING → STARTING for a whole plan in one statement; a job
        cancelled (or changed) since the snapshot is not returned and does not start."""
        if not job_ids:
            return set()
        return set(s.connection().execute(_CLAIM, {"ids": job_ids}).scalars())

    # -- what the API shows (read from the loop's published view) --------------------------------
    def ranked(self, now: float) -> list[tuple[JobRec, Factors | None, str, bool]]:
        """Pending jobs in the order the last pass ranked them, with their factors, reason
        and whether they are starving."""
        factors, hungry = self.priorities, self.hungry
        jobs = list(self.book.pending.values())
        key, unscored = self.policy.queue_key(now, hungry), Factors(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
        assoc = {j.id: j.request.assoc for j in jobs}
        jobs.sort(key=lambda j: key(j.partition, j.submitted_at, j.id, factors.get(j.id, unscored), assoc[j.id]))
        return [(j, factors.get(j.id), self.book.reasons.get(j.id, "None"),
                 self.policy.owed(factors.get(j.id, unscored), now - j.submitted_at, assoc[j.id] in hungry)) for j in jobs]

    def allocations(self) -> list[tuple[JobRec, ReplicaRec, Allocation]]:
        """What each replica holds now, with its job; a stopping replica keeps its resources
        until it has exited."""
        allocs = self.book.allocs
        return [(job, replica, allocs[replica.id]) for job in self.book.active.values()
                for replica in job.replicas if replica.id in allocs]
