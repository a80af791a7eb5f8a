"""A discrete-event replay of a job trace through the real scheduler, over a fake clock.

Events are submissions and completions (and, for the Slurm model, its backfill timer). At
each, the engine builds a snapshot (free GPUs, the pending queue, running jobs with their
expected ends, decayed per-user usage) and applies the plan exactly as the control loop
would. corral's control loop runs a full cycle on every change; Slurm runs its cheap main
scheduler on every event and backfill every ``bf_interval`` (30 s by default), which
``simulate`` models when given ``bf_interval_s``. Jobs run for their true duration; the
scheduler only ever sees their time limits."""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.scheduler import NodeView, PendingJob, Policy, Snapshot, TaskRequest, schedule
from corral.scheduler.applier import apply_starts
from corral.scheduler.placement import FreePool
from corral.scheduler.priority import CALC_PERIOD_S, decay
from corral.scheduler.snapshot import RunningJob
from corral.scheduler.usage import Holding, UsageLedger
from corral.sim.trace import TraceJob


@dataclass
class Outcome:
    job: TraceJob
    start: float
    end: float


@dataclass
class SimResult:
    outcomes: list[Outcome]
    total_gpus: int
    sched_cpu_s: float
    placements: int
    unplaceable: int
    cycles: int
    usage: dict = field(default_factory=dict)  # decayed GPU-seconds per (account, user) at the end

    def metrics(self) -> dict:
        done = self.outcomes
        if not done:
            return {"jobs": 0}
        jct = [o.end - o.job.submit_s for o in done]
        wait = [o.start - o.job.submit_s for o in done]
        slowdown = [max(1.0, (o.end - o.job.submit_s) / max(o.job.duration_s, 10.0)) for o in done]
        first = min(o.job.submit_s for o in done)
        makespan = max(o.end for o in done) - first
        # No schedule ends before its last job could: submitted, then run at once.
        shortest = max(o.job.submit_s + o.job.duration_s for o in done) - first
        busy = sum(o.job.gpus * (o.end - o.start) for o in done)
        per_user: dict[str, list[float]] = {}
        per_user_wait: dict[str, list[float]] = {}
        for o, s, w in zip(done, slowdown, wait):
            per_user.setdefault(o.job.user, []).append(s)
            per_user_wait.setdefault(o.job.user, []).append(w)
        means = [statistics.fmean(v) for v in per_user.values()]
        jain = sum(means) ** 2 / (len(means) * sum(m * m for m in means)) if means else 1.0
        return {
            "jobs": len(done),
            "unplaceable": self.unplaceable,
            "avg_jct_s": round(statistics.fmean(jct), 1),
            "p50_jct_s": round(_pct(jct, 50), 1),
            "p99_jct_s": round(_pct(jct, 99), 1),
            "avg_wait_s": round(statistics.fmean(wait), 1),
            "p99_wait_s": round(_pct(wait, 99), 1),
            "bounded_slowdown": round(statistics.fmean(slowdown), 3),
            "utilization": round(busy / (self.total_gpus * makespan), 4) if makespan > 0 else 0.0,
            "utilization_bound": round(busy / (self.total_gpus * shortest), 4) if shortest > 0 else 0.0,
            "makespan_s": round(makespan, 1),
            "jain_fairness": round(jain, 4),
            "max_user_wait_s": round(max(statistics.fmean(v) for v in per_user_wait.values()), 1),
            "sched_cpu_s": round(self.sched_cpu_s, 3),
            "placements_per_cpu_s": round(self.placements / self.sched_cpu_s, 1) if self.sched_cpu_s > 0 else None,
            "cycles": self.cycles,
        }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def cluster(nodes: int, gpus_per_node: int, nodes_per_leaf: int = 0) -> list[NodeView]:
    return [NodeView(f"node-{i:04d}", gpus_per_node, 1e6, 1e9, None,
                     (("leaf", f"leaf-{i // nodes_per_leaf}"),) if nodes_per_leaf else ()) for i in range(nodes)]


def to_request(job: TraceJob, index: int, largest_node: int, account: str | None = None) -> PendingJob:
    """A trace job as a gang: more GPUs than a node holds become replicas of whole nodes.
    It charges ``account`` (by default one of the user's own)."""
    if job.gpus <= largest_node:
        task = TaskRequest("main", 1, job.gpus, 1.0 if job.gpus == 0 else 0.0, 0.0)
    else:
        task = TaskRequest("main", math.ceil(job.gpus / largest_node), largest_node, 0.0, 0.0)
    return PendingJob(index, (task,), job.submit_s, job.user, account or job.user, job.time_limit_s)


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
             usage_every_s: float | None = None, account_of: Callable[[str], str] | None = None) -> SimResult:
    """``bf_interval_s``: None runs a full cycle on every event, as corral's control loop
    does; a number is Slurm's split, a main-scheduler pass (``schedule(full=False)``) on
    every event and a full pass (reservations, backfill) at most every ``bf_interval_s``,
    when something changed since the last one. A pass is skipped when not even the smallest
    pending replica fits anywhere (it could start nothing). ``priority_calc_s``: how often
    every pending job's priority is recomputed (Slurm's PriorityCalcPeriod, 5 min by
    default); in between, a new job is scored on arrival. ``usage_every_s``: None charges
    each running job's GPU-seconds as they accrue (corral's ledger); a number is Slurm's
    decay pass, which every so often charges the jobs running at that moment for the time
    since the last pass or their start, so a job that starts and ends between two passes is
    never charged (seen on the real Slurm of bench/slurm_fidelity.py: sshare's RawUsage
    matches this rule to the CPU-second). ``account_of``: the account a trace user charges
    (a site's account tree, ``Site.account_of``); by default each user has their own."""
    accounts = {job.user: account_of(job.user) if account_of else job.user for job in jobs}
    total_gpus = sum(n.gpus for n in nodes)
    largest = max(n.gpus for n in nodes)
    pool = FreePool(nodes)
    usage: dict[tuple[str, str], float] = {}
    ledger = UsageLedger(half_life_s)  # corral's rule, the server's ledger; Slurm's passes are modelled below
    events: list[tuple[float, int, int]] = []  # (time, kind, job index)
    unplaceable = 0
    for i, job in enumerate(jobs):
        if job.gpus > total_gpus:
            unplaceable += 1
            continue
        heapq.heappush(events, (job.submit_s, _SUBMIT, i))
    pending: dict[int, PendingJob] = {}
    smallest: Counter[int] = Counter()  # GPUs per replica of the pending jobs' smallest replicas
    running: dict[int, RunningJob] = {}
    starts: dict[int, float] = {}
    outcomes: list[Outcome] = []
    sched_cpu, placements, cycles = 0.0, 0, 0
    last_account = last_calc = -math.inf
    next_pass = -math.inf  # Slurm's next usage pass (usage_every_s)
    next_full, dirty, ticking = -math.inf, False, False
    cached: dict | None = None
    while events:
        now = events[0][0]
        # charge the jobs that ran up to now, before this instant's ends take them away
        if usage_every_s is None:
            ledger.accrue(now, [Holding(accounts[jobs[i].user], jobs[i].user, "", jobs[i].gpus, 0.0, 0.0)
                                for i in running])
            usage = ledger.usage()
        else:
            if next_pass == -math.inf:
                last_account, next_pass = now, now + usage_every_s
            while next_pass <= now:
                for i in running:
                    key = (accounts[jobs[i].user], jobs[i].user)
                    usage[key] = usage.get(key, 0.0) + jobs[i].gpus * (next_pass - max(last_account, starts[i]))
                usage = decay(usage, next_pass - last_account, half_life_s)
                last_account, next_pass = next_pass, next_pass + usage_every_s
        happened = False
        while events and events[0][0] == now:
            _, kind, i = heapq.heappop(events)
            if kind == _SUBMIT:
                pending[i] = request = to_request(jobs[i], i, largest, accounts[jobs[i].user])
                smallest[_smallest(request)] += 1
                happened = True
            elif kind == _END:
                for alloc in running.pop(i).allocations:
                    pool.release(alloc)
                outcomes.append(Outcome(jobs[i], starts[i], now))
                happened = True
            else:
                ticking = False
        dirty = dirty or happened
        full = bf_interval_s is None or now >= next_full
        if not pending or not dirty or (not happened and not full):
            continue
        if full and bf_interval_s is not None:
            next_full, dirty = now + bf_interval_s, False
        elif not full and not ticking:  # the backfill pass due later, even if nothing else happens
            heapq.heappush(events, (next_full, _TICK, -1))
            ticking = True
        if bf_interval_s is None:
            dirty = False
        if pool.count_with(min(smallest)) == 0:
            continue  # nothing could start: the pass would only compute reservations and reasons
        if now - last_calc >= priority_calc_s:
            cached, last_calc = None, now
        snapshot = Snapshot(pool.views(), tuple(pending.values()), tuple(running.values()), usage, priorities=cached)
        t0 = time.process_time()
        plan = schedule(snapshot, now, policy, full=full)
        sched_cpu += time.process_time() - t0
        cached = plan.priorities or None
        cycles += 1
        accepted, _ = apply_starts(pool, plan)  # the control loop's applier
        for start in accepted:
            job = jobs[start.job_id]
            running[start.job_id] = RunningJob(start.job_id, start.allocations, now + job.time_limit_s, job.user,
                                               accounts[job.user], started_at=now)
            starts[start.job_id] = now
            size = _smallest(pending.pop(start.job_id))
            smallest[size] -= 1
            if not smallest[size]:
                del smallest[size]
            placements += 1
            heapq.heappush(events, (now + job.duration_s, _END, start.job_id))
    return SimResult(outcomes, total_gpus, sched_cpu, placements, unplaceable + len(pending), cycles, usage)


_END, _SUBMIT, _TICK = 0, 1, 2


def _smallest(request: PendingJob) -> int:
    return min(t.gpus for t in request.tasks)
