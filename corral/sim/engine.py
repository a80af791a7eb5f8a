"""A discrete-event replay of a job trace through the real scheduler, over a fake clock.

Events are submissions, completions, the end of a stop's grace period (and, for the Slurm
model, its backfill timer). At each, the engine builds a snapshot (free GPUs, the pending
queue, running jobs with their expected ends, decayed per-user usage) and carries the plan
out through the control loop's applier (``apply_plan``). corral's control loop runs a full
cycle on every change; Slurm runs its cheap main scheduler on every event and backfill every
``bf_interval`` (30 s by default), which ``simulate`` models when given ``bf_interval_s``.
Jobs run for their true duration; the scheduler only ever sees their time limits.

Preemption, as the control loop does it, over the fake clock. An evicted job keeps its
resources for ``grace_s`` (its replicas' stop signal and grace period; the scheduler sees it
as being stopped), then gives them back and is either requeued (pending again, its submit
time kept) or cancelled. A requeued job runs its whole duration again, unless its trace row
checkpoints (``checkpoint_s``): then it keeps the work up to its last checkpoint before the
stop, and each restart first spends ``restart_cost_s``. An elastic job (``min_gpus``) may
be shrunk instead: its highest ranks stop and free their GPUs after the same grace, and it
keeps running to its original end (its duration is modelled as unchanged by the shrink,
an optimistic bound for work that slows with fewer workers). A job whose dependency can
never be met is cancelled.

An elastic job that grows on its own (``max_gpus``, ``num_nodes`` grow) is given idle GPUs
by the scheduler's growth step (``corral.scheduler.growth``), up to ``max_gpus``, and gives
back what it grew above its ``gpus`` first when a pending job needs them. Its work is
``duration_s x gpus`` GPU-seconds at its asked size, done at a rate linear in the GPUs it
holds: each GPU up to ``gpus`` counts fully, each GPU above counts ``GROWN_EFFICIENCY``
(0.9: data-parallel scaling is sub-linear), and a shrink slows it the same way, from the
moment its replicas are told to stop. A job shrunk for another grows again no sooner than
``growth.SETTLE_S`` later. Every such action goes through the applier, re-checked as the
loop re-checks it (a victim already gone is skipped, no shrink goes below the minimum)."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from corral.scheduler import Dependency, NodeView, PendingJob, Policy, Snapshot, TaskRequest, schedule
from corral.scheduler.applier import Downsize, Eviction, apply_plan
from corral.scheduler.growth import SETTLE_S
from corral.scheduler.durations import DurationModel, planned_end
from corral.scheduler.placement import FreePool
from corral.scheduler.plan import Allocation, Grow
from corral.scheduler.priority import CALC_PERIOD_S, decay
from corral.scheduler.snapshot import Growable, RunningJob, Shrinkable
from corral.scheduler.usage import Holding, UsageLedger
from corral.sim.results import Cancelled, Hold, Outcome, SimResult
from corral.sim.trace import TraceJob

GROWN_EFFICIENCY = 0.9  # what a GPU above a growing job's asked size adds to its pace

__all__ = ["Cancelled", "Hold", "Outcome", "SimResult", "cluster", "loop_of", "simulate", "to_request"]


def cluster(nodes: int, gpus_per_node: int, nodes_per_leaf: int = 0) -> list[NodeView]:
    return [NodeView(f"node-{i:04d}", gpus_per_node, 1e6, 1e9, None,
                     (("leaf", f"leaf-{i // nodes_per_leaf}"),) if nodes_per_leaf else ()) for i in range(nodes)]


def to_request(job: TraceJob, index: int, largest_node: int, account: str | None = None,
               dependencies: tuple[Dependency, ...] = ()) -> PendingJob:
    """A trace job as a gang: more GPUs than a node holds become replicas of whole nodes; an
    elastic one is one-GPU replicas. It charges ``account`` (by default one of the user's
    own); ``dependencies`` name jobs by trace index and cancel it if never met."""
    if job.min_gpus is not None:
        task = TaskRequest("main", job.gpus, 1, 0.0, 0.0)
    elif job.gpus <= largest_node:
        task = TaskRequest("main", 1, job.gpus, 1.0 if job.gpus == 0 else 0.0, 0.0)
    else:
        task = TaskRequest("main", math.ceil(job.gpus / largest_node), largest_node, 0.0, 0.0)
    return PendingJob(index, (task,), job.submit_s, job.user, account or job.user, job.time_limit_s,
                      partition=job.partition, qos=job.qos, dependencies=dependencies,
                      kill_on_invalid_dep=bool(dependencies))


def loop_of(policy: str, bf_interval_s: float = 30.0) -> dict:
    """How a named policy's loop runs, as ``simulate``'s keyword arguments: ``slurm`` gets
    Slurm's split passes (backfill every ``bf_interval_s``) and its 5-minute
    PriorityCalcPeriod, which is also when it charges fair-share usage; ``fifo`` and
    ``corral`` run as corral's control loop does, a full cycle on every event with priorities
    rescored every few seconds and usage charged as it accrues."""
    if policy == "slurm":
        return {"bf_interval_s": bf_interval_s, "priority_calc_s": 300.0, "usage_every_s": 300.0}
    return {"bf_interval_s": None, "priority_calc_s": CALC_PERIOD_S}



def simulate(jobs: list[TraceJob], nodes: list[NodeView], policy: Policy, bf_interval_s: float | None = None,
             half_life_s: float = 7 * 86400.0, priority_calc_s: float = 300.0,
             usage_every_s: float | None = None, account_of: Callable[[str], str] | None = None,
             grace_s: float = 30.0, record: bool = False) -> SimResult:
    """``bf_interval_s``: None runs a full cycle on every event, as corral's control loop
    does; a number is Slurm's split, a main-scheduler pass (``schedule(full=False)``) on
    every event and a full pass (reservations, backfill) at most every ``bf_interval_s``,
    when something changed since the last one. A pass is skipped when not even the smallest
    pending replica fits anywhere (it could start nothing) and the policy never preempts.
    ``priority_calc_s``: how often every pending job's priority is recomputed (Slurm's
    PriorityCalcPeriod, 5 min by default); in between, a new job is scored on arrival.
    ``usage_every_s``: None charges each running job's GPU-seconds as they accrue (corral's
    ledger); a number is Slurm's decay pass, which every so often charges the jobs running
    at that moment for the time since the last pass or their start, so a job that starts
    and ends between two passes is never charged (seen on the real Slurm of
    bench/slurm_fidelity.py: sshare's RawUsage matches this rule to the CPU-second).
    ``account_of``: the account a trace user charges (a site's account tree,
    ``Site.account_of``); by default each user has their own. ``grace_s``: how long a
    preempted job, or a shrunk task's stopped replicas, hold their resources after the stop
    signal. ``record``: keep every allocation's hold (``SimResult.holds``), for checks."""
    if not grace_s >= 0 or math.isinf(grace_s):
        raise ValueError(f"grace_s: a finite number of seconds of at least 0, got {grace_s!r}")
    accounts = {job.user: account_of(job.user) if account_of else job.user for job in jobs}
    total_gpus = sum(n.gpus for n in nodes)
    run = _Replay(jobs, nodes, policy, accounts, grace_s, record)
    usage: dict[tuple[str, str], float] = {}
    ledger = UsageLedger(half_life_s)  # corral's rule, the server's ledger; Slurm's passes are modelled below
    events = run.events
    unplaceable = 0
    for i, job in enumerate(jobs):
        if job.gpus > total_gpus:
            unplaceable += 1
            continue
        heapq.heappush(events, (job.submit_s, _SUBMIT, i, 0))
    pending, running, lives = run.pending, run.running, run.lives
    smallest = run.smallest
    sched_cpu, cycles = 0.0, 0
    last_account = last_calc = -math.inf
    next_pass = -math.inf  # Slurm's next usage pass (usage_every_s)
    next_full, dirty, ticking = -math.inf, False, False
    cached: dict | None = None
    preempting = policy.preempting  # then a pass may stop work even when nothing fits
    while events:
        now = events[0][0]
        # charge the jobs that ran up to now, before this instant's ends take them away
        if usage_every_s is None:
            ledger.accrue(now, [Holding(accounts[jobs[i].user], jobs[i].user, "", lives[i].gpus, 0.0, 0.0)
                                for i in running])
            usage = ledger.usage()
        else:
            if next_pass == -math.inf:
                last_account, next_pass = now, now + usage_every_s
            while next_pass <= now:
                for i in running:
                    key = (accounts[jobs[i].user], jobs[i].user)
                    usage[key] = usage.get(key, 0.0) + lives[i].gpus * (next_pass - max(last_account, lives[i].since))
                usage = decay(usage, next_pass - last_account, half_life_s)
                last_account, next_pass = next_pass, next_pass + usage_every_s
        happened = False
        while events and events[0][0] == now:
            _, kind, i, token = heapq.heappop(events)
            if kind == _SUBMIT:
                run.submit(i)
                happened = True
            elif kind == _END:
                happened = run.end(i, token, now) or happened
            elif kind in (_STOPPED, _AGAIN):
                if kind == _STOPPED:
                    run.stopped(token, now)
                happened = True
            else:
                ticking = False
        dirty = dirty or happened
        full = bf_interval_s is None or now >= next_full
        growing = run.growers and run.pool.free_gpus > 0  # idle GPUs a growing job may take
        if (not pending and not growing) or not dirty or (not happened and not full):
            continue
        if full and bf_interval_s is not None:
            next_full, dirty = now + bf_interval_s, False
        elif not full and not ticking:  # the backfill pass due later, even if nothing else happens
            heapq.heappush(events, (next_full, _TICK, -1, 0))
            ticking = True
        if bf_interval_s is None:
            dirty = False
        if not preempting and not growing and not run.lending() and \
                (not smallest or run.pool.count_with(min(smallest)) == 0):
            continue  # nothing could start: the pass would only compute reservations and reasons
        run.overrun(now)
        if now - last_calc >= priority_calc_s:
            cached, last_calc = None, now
            run.refresh()
        snapshot = Snapshot(run.pool.views(), tuple(pending.values()), tuple(running.values()), usage,
                            job_states=run.states, priorities=cached)
        t0 = time.process_time()
        plan = schedule(snapshot, now, policy, full=full)
        sched_cpu += time.process_time() - t0
        cached = plan.priorities or None
        cycles += 1
        applied = apply_plan(run.pool, plan, snapshot.running, policy, pending)  # the control loop's applier
        for start in applied.accepted:
            factors = plan.priorities.get(start.job_id)
            run.start(start.job_id, start.allocations, now, factors.total if factors is not None else 0.0)
        for eviction in applied.evictions:
            run.evict(eviction, now)
        for downsize in applied.downsizes:
            run.shrink(downsize, now)
        for grow in applied.grown:
            run.grow(grow, now)
        for cancel in applied.cancels:
            run.cancel_pending(cancel.job_id, cancel.why, now)
        if applied.accepted and run.growers and run.pool.free_gpus:  # a job that grows may take what is left
            heapq.heappush(events, (now, _AGAIN, -1, 0))
        if applied.cancels and run.states:  # as the loop rescans: a job waiting on one is cancelled next
            heapq.heappush(events, (now, _AGAIN, -1, 0))
    return SimResult(run.outcomes, total_gpus, sched_cpu, run.placements, unplaceable + len(pending), cycles, usage,
                     run.cancelled, run.preemptions, run.requeues, run.shrinks, run.lost_gpu_s, run.holds, run.grown)


# at one instant: grace periods over, then ends, then arrivals; _AGAIN is another pass at once
_STOPPED, _END, _SUBMIT, _TICK, _AGAIN = -1, 0, 1, 2, 3
_UNKNOWN = -1  # the trace index of a job not in the trace: no state, so a dependency on it is never met


@dataclass
class _Life:
    """One trace job's run so far, across its attempts."""

    first_start: float | None = None
    since: float = 0.0  # the current attempt's start
    token: int = 0  # the current attempt: a completion scheduled for an earlier one is void
    restarts: int = 0
    kept: float = 0.0  # seconds of work its checkpoints kept
    gpus: int = 0  # GPUs held now
    mark: float = 0.0  # GPU-seconds are counted up to here
    gpu_s: float = 0.0  # ... held so far, every attempt
    gpu_s_at_start: float = 0.0  # ... before the current attempt
    lost: float = 0.0  # ... counted as lost to preemption
    yields_to: int = 0  # preempted for this job: it goes first once requeued (``PendingJob.yields_to``)
    # a growing job's pace (``max_gpus``): GPU-seconds of work left as of ``paced``, the GPUs
    # working on it, the end its pace gives, and when it was last shrunk for another job
    left: float = 0.0
    paced: float = 0.0
    working: int = 0
    end_at: float | None = None
    shrunk_at: float = -math.inf


@dataclass(frozen=True)
class _Stop:
    """A stop in its grace period: a whole job (``mode`` requeue or cancel, with the work
    its checkpoints keep) or a shrink's replicas (``mode`` shrink, ``allocations``)."""

    index: int
    mode: str
    token: int
    kept: float = 0.0
    allocations: tuple[Allocation, ...] = ()
    why: str = ""


class _Replay:
    """The mutable state of a replay and the moves of its jobs: start, end, evict, shrink,
    a stop's grace period ending, a cancel."""

    def __init__(self, jobs: list[TraceJob], nodes: list[NodeView], policy: Policy, accounts: dict[str, str],
                 grace_s: float, record: bool):
        self.jobs, self.policy, self.accounts, self.grace_s, self.record = jobs, policy, accounts, grace_s, record
        self.pool = FreePool(nodes)
        self.largest = max(n.gpus for n in nodes)
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, job index, token)
        self.pending: dict[int, PendingJob] = {}
        self.smallest: Counter[int] = Counter()  # GPUs per replica of the pending jobs' smallest replicas
        self.running: dict[int, RunningJob] = {}
        self.lives = [_Life() for _ in jobs]
        index = {job.id: i for i, job in enumerate(jobs)}
        self.dependencies = [tuple(Dependency(kind, tuple(index.get(name, _UNKNOWN) for name in names))
                                   for kind, names in job.dependency) for job in jobs]
        # what dependencies read; a job not submitted yet is waited for
        self.states: dict[int, str] = dict.fromkeys(range(len(jobs)), "PENDING") if any(self.dependencies) else {}
        self.stops: dict[int, _Stop] = {}  # by a key of their own, the token of their event
        self.stop_count = 0
        self.outcomes: list[Outcome] = []
        self.cancelled: list[Cancelled] = []
        self.holds: list[Hold] = []
        self.held: dict[int, dict[Allocation, float]] = {}  # job -> allocation -> since (when recording)
        self.placements = self.preemptions = self.requeues = self.shrinks = self.grown = 0
        self.growers: set[int] = set()  # running jobs that grow on their own
        self.lost_gpu_s = 0.0
        # run times learned from the replay's own completions, when the policy plans with them
        self.durations = DurationModel(max_spread=policy.learn_spread) if policy.learn_durations else None
        self.predicted: dict[int, float] = {}  # a job's latest prediction (as it last queued)
        self.seen = 0  # the model's version when pending predictions were last refreshed
        self.overruns: list[tuple[float, int, int]] = []  # (predicted end, job, token) of running jobs

    def _state(self, i: int, state: str) -> None:
        if self.states:
            self.states[i] = state

    def _charge(self, life: _Life, now: float) -> None:
        life.gpu_s += life.gpus * (now - life.mark)
        life.mark = now

    def _release(self, i: int, allocations: tuple[Allocation, ...], now: float) -> None:
        for alloc in allocations:
            self.pool.release(alloc)
        if self.record:
            mine = self.held[i]
            self.holds += [Hold(i, a, mine.pop(a), now) for a in allocations]

    def _elastic(self, job: TraceJob, allocations: tuple[Allocation, ...]) -> tuple[Shrinkable, ...]:
        if job.min_gpus is None or len(allocations) <= job.min_gpus:
            return ()
        # what a growing job grew above its asked size is lent: anyone takes it back first
        return (Shrinkable("main", job.min_gpus, tuple(sorted(allocations, key=lambda a: a.rank)),
                           job.gpus if job.max_gpus is not None else None),)

    def _growable(self, i: int, allocations: tuple[Allocation, ...]) -> tuple[Growable, ...]:
        job = self.jobs[i]
        if job.max_gpus is None or len(allocations) >= job.max_gpus:
            return ()
        return (Growable("main", len(allocations), job.max_gpus, TaskRequest("main", 1, 1, 0.0, 0.0),
                         self.lives[i].shrunk_at + SETTLE_S),)

    def lending(self) -> bool:
        """Whether a running job holds GPUs it grew into (any pending job may take them back)."""
        return bool(self.growers) and any(p.lent for i in self.growers if i in self.running
                                          for p in self.running[i].elastic)

    def _pace(self, i: int, working: int, now: float) -> None:
        """A growing job's work goes on with ``working`` GPUs from ``now``: its end moves."""
        job, life = self.jobs[i], self.lives[i]
        life.left = max(0.0, life.left - (now - life.paced) * _rate(life.working, job.gpus))
        life.paced, life.working = now, working
        life.end_at = now + life.left / _rate(working, job.gpus) if working else math.inf
        if life.end_at < math.inf:
            heapq.heappush(self.events, (life.end_at, _END, i, life.token))

    def grow(self, grow: Grow, now: float) -> None:
        """The applier took the allocations in the pool: the job holds and works on them now."""
        i = grow.job_id
        r, life = self.running[i], self.lives[i]
        self._charge(life, now)
        allocations = r.allocations + grow.allocations
        life.gpus += sum(len(a.gpus) for a in grow.allocations)
        if self.record:
            self.held[i].update(dict.fromkeys(grow.allocations, now))
        self.running[i] = replace(r, allocations=allocations, elastic=self._elastic(self.jobs[i], allocations),
                                  growable=self._growable(i, allocations))
        self._pace(i, life.working + len(grow.allocations), now)
        self.grown += len(grow.allocations)

    def submit(self, i: int) -> None:
        job = self.jobs[i]
        request = to_request(job, i, self.largest, self.accounts[job.user], self.dependencies[i])
        if self.durations is not None:
            request = self._predicted(i, request)
        if self.lives[i].gpu_s:  # a requeued job: what it attained counts (least attained service)
            request = replace(request, attained_gpu_s=self.lives[i].gpu_s, yields_to=self.lives[i].yields_to)
        self.pending[i] = request
        self.smallest[_smallest(request)] += 1

    def _predicted(self, i: int, request: PendingJob) -> PendingJob:
        job = self.jobs[i]
        guess = self.durations.predict(job.user, "", job.gpus, job.time_limit_s)
        if guess is None:
            return request
        self.predicted[i] = guess
        return replace(request, expected=guess)

    def refresh(self) -> bool:
        """Pending jobs' predictions brought up to what the model learned since; True if any
        changed (their priorities must be computed again)."""
        if self.durations is None or self.durations.version == self.seen:
            return False
        self.seen = self.durations.version
        changed = False
        for i, request in self.pending.items():
            again = self._predicted(i, request)
            if again.expected != request.expected:
                self.pending[i], changed = again, True
        return changed

    def overrun(self, now: float) -> None:
        """Running jobs past their predicted end are planned with their time limit from now on."""
        while self.overruns and self.overruns[0][0] <= now:
            _, i, token = heapq.heappop(self.overruns)
            r = self.running.get(i)
            if r is not None and self.lives[i].token == token and not r.ending:
                self.running[i] = replace(r, expected_end=r.started_at + self.jobs[i].time_limit_s)

    def _unqueue(self, i: int) -> None:
        size = _smallest(self.pending.pop(i))
        self.smallest[size] -= 1
        if not self.smallest[size]:
            del self.smallest[size]

    def start(self, i: int, allocations: tuple[Allocation, ...], now: float, priority: float) -> None:
        job, life = self.jobs[i], self.lives[i]
        life.yields_to = 0
        expected = self.pending[i].expected
        end = planned_end(now, expected, job.time_limit_s, now)
        self.running[i] = RunningJob(i, allocations, end, job.user, self.accounts[job.user],
                                     job.partition, job.qos, started_at=now, priority=priority,
                                     elastic=self._elastic(job, allocations), no_requeue=job.no_requeue,
                                     limit_end=now + job.time_limit_s, preemptible=bool(job.checkpoint_s),
                                     restart_cost_s=job.restart_cost_s, attained_gpu_s=life.gpu_s,
                                     preempted=life.restarts, growable=self._growable(i, allocations))
        if life.first_start is None:
            life.first_start = now
        life.since = life.mark = now
        life.gpus = job.gpus
        life.gpu_s_at_start = life.gpu_s
        life.token += 1
        if expected is not None and end < now + job.time_limit_s:
            heapq.heappush(self.overruns, (end, i, life.token))
        if self.record:
            self.held[i] = dict.fromkeys(allocations, now)
        self._state(i, "RUNNING")
        self._unqueue(i)
        self.placements += 1
        work = job.duration_s - life.kept
        if life.restarts:
            work += job.restart_cost_s
        if job.max_gpus is not None:  # its pace follows the GPUs it holds
            self.growers.add(i)
            life.left, life.paced, life.working = work * job.gpus, now, job.gpus
            life.end_at = now + work
        heapq.heappush(self.events, (now + work, _END, i, life.token))

    def end(self, i: int, token: int, now: float) -> bool:
        """The job's work is done, unless that attempt was stopped since (then: False)."""
        life = self.lives[i]
        if token != life.token or i not in self.running or life.end_at is not None and now != life.end_at:
            return False  # (a growing job's end moved since this one was planned)
        life.end_at = None
        self.growers.discard(i)
        self._release(i, self.running.pop(i).allocations, now)
        self._charge(life, now)
        if life.restarts and self.jobs[i].restart_cost_s:  # its last restart's overhead: lost to preemption too
            overhead = life.gpus * self.jobs[i].restart_cost_s
            life.lost += overhead
            self.lost_gpu_s += overhead
        life.gpus = 0
        job = self.jobs[i]
        if self.durations is not None:
            # what a fresh run of it takes: the work since its last start, less its restart cost
            self.durations.observe(job.user, "", job.gpus, job.duration_s)
        self.outcomes.append(Outcome(job, life.first_start, now, life.gpu_s, life.restarts, self.predicted.get(i)))
        self._state(i, "SUCCEEDED")
        return True

    def evict(self, eviction: Eviction, now: float) -> None:
        i = eviction.job_id
        job, life = self.jobs[i], self.lives[i]
        life.token += 1  # its completion is void: it stops now
        kept = 0.0
        if eviction.mode == "requeue" and job.checkpoint_s:
            progress = life.kept + max(0.0, now - life.since - (job.restart_cost_s if life.restarts else 0.0))
            kept = min(job.duration_s, math.floor(progress / job.checkpoint_s) * job.checkpoint_s)
        why = "preempted (no requeue)" if job.no_requeue else "preempted (preempt mode cancel)"
        life.yields_to = eviction.for_job
        self._stop(_Stop(i, eviction.mode, life.token, kept, why=why), now)
        self.running[i] = replace(self.running[i], ending=True, elastic=(), growable=())
        self.growers.discard(i)
        life.end_at = None
        self.preemptions += 1

    def shrink(self, downsize: Downsize, now: float) -> None:
        i = downsize.job_id
        r = self.running[i]
        self._stop(_Stop(i, "shrink", self.lives[i].token, allocations=downsize.stopped), now)
        # as the loop shows it: the stopping replicas are no longer surplus, and free soon
        self.running[i] = replace(r, elastic=(), stopping=r.stopping + downsize.stopped, growable=())
        self.shrinks += 1
        if i in self.growers:  # its stopped replicas work no more; it grows again after settling
            self.lives[i].shrunk_at = now
            self._pace(i, self.lives[i].working - len(downsize.stopped), now)
            heapq.heappush(self.events, (now + SETTLE_S, _AGAIN, -1, 0))

    def _stop(self, stop: _Stop, now: float) -> None:
        key = self.stop_count = self.stop_count + 1
        self.stops[key] = stop
        heapq.heappush(self.events, (now + self.grace_s, _STOPPED, stop.index, key))

    def stopped(self, key: int, now: float) -> None:
        """A stop's grace period is over: its resources come back."""
        stop = self.stops.pop(key)
        i, life, job = stop.index, self.lives[stop.index], self.jobs[stop.index]
        if stop.mode == "shrink":
            if i not in self.running or life.token != stop.token:
                return  # the job ended or was evicted meanwhile: its own release took these
            r = self.running[i]
            self._release(i, stop.allocations, now)
            self._charge(life, now)
            life.gpus -= sum(len(a.gpus) for a in stop.allocations)
            left = tuple(a for a in r.allocations if a not in stop.allocations)
            stopping = tuple(a for a in r.stopping if a not in stop.allocations)
            self.running[i] = replace(r, allocations=left, stopping=stopping,
                                      elastic=() if stopping else self._elastic(job, left),
                                      growable=() if stopping else self._growable(i, left))
            return
        self._release(i, self.running.pop(i).allocations, now)
        self._charge(life, now)
        if stop.mode == "requeue":
            lost = life.gpu_s - life.gpu_s_at_start - life.gpus * (stop.kept - life.kept)
            life.kept = stop.kept
            life.restarts += 1
            self.requeues += 1
            self._state(i, "PENDING")
            self.submit(i)  # pending again with its original submit time
        else:
            lost = life.gpu_s - life.lost  # all it ever held
            self._state(i, "CANCELLED")
            self.cancelled.append(Cancelled(job, now, stop.why, life.first_start, life.gpu_s, life.restarts))
        life.gpus = 0
        life.lost += lost
        self.lost_gpu_s += lost

    def cancel_pending(self, i: int, why: str, now: float) -> None:
        self._unqueue(i)
        life = self.lives[i]
        self._state(i, "CANCELLED")
        self.cancelled.append(Cancelled(self.jobs[i], now, why, life.first_start, life.gpu_s, life.restarts))


def _rate(working: int, gpus: int) -> float:
    """GPU-seconds of a growing job's work done per second with ``working`` GPUs (asked: ``gpus``)."""
    return min(working, gpus) + GROWN_EFFICIENCY * max(0, working - gpus)


def _smallest(request: PendingJob) -> int:
    return min(t.gpus for t in request.tasks)
