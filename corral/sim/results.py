"""What a replay gives back: each job's outcome (succeeded, or cancelled by a preemption or
an unsatisfiable dependency), the preemption counters, and the metrics tables and the CLI
print (JCT, waits, slowdown, utilisation, fairness, scheduler cost, preemption cost)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from corral.scheduler.plan import Allocation
from corral.sim.trace import TraceJob


@dataclass
class Outcome:
    """A job that ran to completion. ``start``: its first start (a requeued job started
    again later); ``gpu_s``: the GPU-seconds it held over every attempt, grace periods
    included; ``restarts``: how often it was requeued."""

    job: TraceJob
    start: float
    end: float
    gpu_s: float = 0.0
    restarts: int = 0
    predicted: float | None = None  # the run time it was planned with, when durations were learned


@dataclass
class Cancelled:
    """A job that never finished: ``why`` is ``preempted`` (its preempt mode, or its
    no-requeue flag, said cancel) or the unsatisfiable dependency. ``start``: its first
    start, None if it never ran."""

    job: TraceJob
    at: float
    why: str
    start: float | None = None
    gpu_s: float = 0.0
    restarts: int = 0


@dataclass(frozen=True)
class Hold:
    """One allocation held by job ``index`` (its position in the trace) over [start, end)."""

    index: int
    allocation: Allocation
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
    cancelled: list[Cancelled] = field(default_factory=list)
    preemptions: int = 0  # jobs stopped whole to make room (each then requeued or cancelled)
    requeues: int = 0
    shrinks: int = 0  # elastic tasks scaled down instead
    # GPU-seconds preemption wasted: what a requeued job held in the attempt it lost, less the
    # work its checkpoints kept, and the restart cost of the attempt that finished; all a
    # cancelled victim ever held. Grace periods count.
    lost_gpu_s: float = 0.0
    holds: list[Hold] = field(default_factory=list)  # every allocation over time, when asked to record them

    def metrics(self) -> dict:
        done = self.outcomes
        if not done:
            return {"jobs": 0, **self._preemption()}
        jct = [o.end - o.job.submit_s for o in done]
        wait = [o.start - o.job.submit_s for o in done]
        slowdown = [max(1.0, (o.end - o.job.submit_s) / max(o.job.duration_s, 10.0)) for o in done]
        first = min(o.job.submit_s for o in done)
        makespan = max(o.end for o in done) - first
        # No schedule ends before its last job could: submitted, then run at once.
        shortest = max(o.job.submit_s + o.job.duration_s for o in done) - first
        busy = sum(o.gpu_s for o in done) + sum(c.gpu_s for c in self.cancelled)
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
            **self._preemption(),
        }

    def _preemption(self) -> dict:
        return {"cancelled": len(self.cancelled), "preemptions": self.preemptions, "requeues": self.requeues,
                "shrinks": self.shrinks, "lost_gpu_s": round(self.lost_gpu_s, 1)}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
