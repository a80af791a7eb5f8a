"""What a replay gives back: each job's outcome (succeeded, or cancelled by a preemption or
an unsatisfiable dependency), the preemption counters, and the metrics a scheduling study
reads (JCT beside its zero-wait floor, waits and bounded slowdown with their tails,
utilisation over the makespan and while jobs still arrive, per-user waits, scheduler cost,
what preemption cost). The per-job series (waits, slowdowns, GPUs in use over time) are
here too, so the table and the plot (``corral.sim.plot``) read the same numbers."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from corral.scheduler.plan import Allocation
from corral.sim.trace import TraceJob

BOUND_S = 10.0  # bounded slowdown's floor on run time (Feitelson et al.)


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
    grown: int = 0  # GPUs elastic jobs grew into on their own (``max_gpus``)

    def waits(self) -> list[float]:
        """Each completed job's wait: submit to first start (a requeued job's later waits
        are in its JCT, not here)."""
        return [o.start - o.job.submit_s for o in self.outcomes]

    def slowdowns(self) -> list[float]:
        """Each completed job's bounded slowdown: JCT over its run time, run times under
        10 s counted as 10 s (so a 1-s job that waited 5 s is not a slowdown of 6), at least 1."""
        return [max(1.0, (o.end - o.job.submit_s) / max(o.job.duration_s, BOUND_S)) for o in self.outcomes]

    def gpus_in_use(self) -> tuple[list[float], list[int]]:
        """GPUs held over time, from the recorded holds (``simulate(record=True)``), as a step
        series: from ``times[k]`` until ``times[k + 1]`` exactly ``gpus[k]`` GPUs are held.
        Empty when the replay recorded no holds."""
        delta: dict[float, int] = {}
        for hold in self.holds:
            n = len(hold.allocation.gpus)
            delta[hold.start] = delta.get(hold.start, 0) + n
            delta[hold.end] = delta.get(hold.end, 0) - n
        times, gpus, held = [], [], 0
        for t in sorted(delta):
            held += delta[t]
            times.append(t)
            gpus.append(held)
        return times, gpus

    def metrics(self) -> dict:
        done = self.outcomes
        if not done:
            return {"jobs": 0, **self._preemption()}
        jct = [o.end - o.job.submit_s for o in done]
        wait = self.waits()
        slowdown = self.slowdowns()
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
        user_waits = sorted(((statistics.fmean(v), u) for u, v in per_user_wait.items()), key=lambda x: (-x[0], x[1]))
        avg_jct = statistics.fmean(jct)
        # the zero-wait floor: the mean JCT if every job had started the moment it arrived
        floor = statistics.fmean(o.job.duration_s for o in done)
        return {
            "jobs": len(done),
            "unplaceable": self.unplaceable,
            "avg_jct_s": round(avg_jct, 1),
            "p50_jct_s": round(_pct(jct, 50), 1),
            "p99_jct_s": round(_pct(jct, 99), 1),
            "jct_floor_s": round(floor, 1),
            "jct_over_floor": round(avg_jct / floor, 4),
            "avg_wait_s": round(statistics.fmean(wait), 1),
            "p50_wait_s": round(_pct(wait, 50), 1),
            "p99_wait_s": round(_pct(wait, 99), 1),
            "bounded_slowdown": round(statistics.fmean(slowdown), 3),
            "p99_bounded_slowdown": round(_pct(slowdown, 99), 3),
            "utilization": round(busy / (self.total_gpus * makespan), 4) if makespan > 0 else 0.0,
            "utilization_bound": round(busy / (self.total_gpus * shortest), 4) if shortest > 0 else 0.0,
            "utilization_in_window": self._in_window(first, max(o.job.submit_s for o in done)),
            "makespan_s": round(makespan, 1),
            "jain_fairness": round(jain, 4),
            "max_user_wait_s": round(user_waits[0][0], 1),
            "max_wait_user": user_waits[0][1],
            "user_mean_wait_s": {u: round(w, 1) for w, u in user_waits},  # worst first
            "sched_cpu_s": round(self.sched_cpu_s, 3),
            "placements_per_cpu_s": round(self.placements / self.sched_cpu_s, 1) if self.sched_cpu_s > 0 else None,
            "cycles": self.cycles,
            **self._preemption(),
            # the share of all GPU time held that preemption threw away
            "lost_gpu_share": round(self.lost_gpu_s / busy, 4) if busy > 0 else 0.0,
        }

    def _in_window(self, start: float, end: float) -> float | None:
        """The mean share of GPUs held from the first submission to the last: utilisation
        while work still arrives, which the drain after the last arrival (one long job
        finishing alone) does not dilute, as it does the makespan's. None without recorded
        holds, or when every job arrived at one instant."""
        if not self.holds or end <= start:
            return None
        held = sum(len(h.allocation.gpus) * max(0.0, min(h.end, end) - max(h.start, start)) for h in self.holds)
        return round(held / (self.total_gpus * (end - start)), 4)

    def _preemption(self) -> dict:
        return {"cancelled": len(self.cancelled), "preemptions": self.preemptions, "requeues": self.requeues,
                "shrinks": self.shrinks, "grown": self.grown,
                "lost_gpu_s": round(self.lost_gpu_s, 1)}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# what a study compares between policies, as ratios to a baseline (lower is better for all
# but the utilisations)
COMPARED = ("avg_wait_s", "p50_wait_s", "p99_wait_s", "bounded_slowdown", "p99_bounded_slowdown", "avg_jct_s",
            "jct_over_floor", "utilization", "utilization_in_window", "max_user_wait_s", "lost_gpu_s")


def ratios(mine: dict, baseline: dict, keys: tuple[str, ...] = COMPARED) -> dict[str, float | None]:
    """``mine[key] / baseline[key]`` for each compared metric; None where the baseline's value
    is 0 or missing (a ratio to nothing says nothing: both waited 0 s, say)."""
    out: dict[str, float | None] = {}
    for key in keys:
        a, b = mine.get(key), baseline.get(key)
        out[key] = round(a / b, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    return out
