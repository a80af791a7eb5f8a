"""Usage histograms for the accounting chart: each run's GPU- and CPU-seconds spread over
fixed time buckets, per user or account. Pure: the route reads the runs, this adds them up.
Each run costs O(1) (a difference array carries the full buckets it spans), so a window of
thousands of jobs over hundreds of buckets stays cheap."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from corral.store.repository import Run

# Bucket sizes a chart reads easily: a minute up to a week.
STEPS = (60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)
MAX_BUCKETS = 2000


def step_for(span: float, buckets: int = 60) -> float:
    """The smallest of ``STEPS`` that covers ``span`` seconds in at most ``buckets`` bars."""
    return next((s for s in STEPS if span / s <= buckets), STEPS[-1])


@dataclass
class Series:
    key: str
    jobs: int = 0
    gpu: list[float] = field(default_factory=list)  # GPU-hours per bucket
    cpu: list[float] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return sum(self.gpu)

    @property
    def cpu_hours(self) -> float:
        return sum(self.cpu)


class _Spread:
    """One quantity of one key: partial buckets added directly, full ones through a
    difference array of rates."""

    def __init__(self, n: int):
        self.edge = [0.0] * n
        self.rate = [0.0] * (n + 1)

    def add(self, first: int, last: int, head: float, tail: float, rate: float) -> None:
        if first == last:
            self.edge[first] += head
            return
        self.edge[first] += head
        self.edge[last] += tail
        self.rate[first + 1] += rate
        self.rate[last] -= rate

    def totals(self, step: float) -> list[float]:
        out, running = [], 0.0
        for edge, change in zip(self.edge, self.rate):
            running += change
            out.append(edge + running * step)
        return out


def grid(since: float, until: float, step: float) -> tuple[float, int]:
    """The first bucket's start (``since`` rounded down to a whole step, so bars begin on the
    minute, the hour or the day) and how many buckets reach ``until``."""
    origin = math.floor(since / step) * step
    return origin, max(1, math.ceil((until - origin) / step))


def spread(runs: Iterable[Run], key: Callable[[Run], str], since: float, until: float, step: float,
           now: float) -> list[Series]:
    """Per key, the hours of GPUs and CPUs held within ``[since, until)`` in each bucket of
    ``grid``, a run still going counting up to ``now``; largest GPU-hours first, then
    CPU-hours, then key."""
    origin, n = grid(since, until, step)
    spreads: dict[str, tuple[Series, _Spread, _Spread]] = {}
    for run in runs:
        start, end = max(run.started_at, since), min(run.ended_at if run.ended_at is not None else now, until)
        if end <= start:
            continue
        name = key(run)
        if name not in spreads:
            spreads[name] = (Series(name), _Spread(n), _Spread(n))
        series, gpu, cpu = spreads[name]
        series.jobs += 1
        first, last = int((start - origin) // step), min(n - 1, int((end - origin) // step))
        head = (min(end, origin + (first + 1) * step) - start) / 3600
        tail = (end - (origin + last * step)) / 3600
        gpu.add(first, last, head * run.gpus, tail * run.gpus, run.gpus / 3600)
        cpu.add(first, last, head * run.cpus, tail * run.cpus, run.cpus / 3600)
    out = []
    for series, gpu, cpu in spreads.values():
        series.gpu, series.cpu = gpu.totals(step), cpu.totals(step)
        out.append(series)
    return sorted(out, key=lambda s: (-s.gpu_hours, -s.cpu_hours, s.key))
