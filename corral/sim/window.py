"""A window of a trace: the jobs submitted in [after, before), the load they offer a cluster,
and the cluster size that puts that load at a target.

A study replays windows rather than whole traces so that it can look at several periods of
one cluster's history (a busy week, a quiet one) in minutes each. ``load_trace`` already
keeps the jobs at or after ``after``; ``before`` is cut here, after the time limits are
drawn, so a job's modelled limit is the same in every window that holds it.

Offered load is what the jobs ask of the cluster over the window: the sum of GPUs × run
time over the window's span × the cluster's GPUs. A window cut from a long trace holds jobs
that run far past its end (philly-pollux has jobs of weeks); ``in_window_load`` counts only
the part of each job that could run before the window closes, the work that competes for
the cluster while jobs still arrive. Where the two are far apart the window is mostly long
jobs' tails, and sizing by the first leaves the window without a queue."""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral.sim.trace import TraceJob


def cut(jobs: Iterable[TraceJob], before: float | None) -> list[TraceJob]:
    """The jobs submitted before ``before`` (all of them when it is None)."""
    return [j for j in jobs if before is None or j.submit_s < before]


def span(jobs: list[TraceJob], after: float | None = None, before: float | None = None) -> float:
    """The window's length in seconds: from ``after`` (or the first submission) to ``before``
    (or the last submission)."""
    if not jobs:
        return 0.0
    start = after if after is not None else jobs[0].submit_s
    end = before if before is not None else jobs[-1].submit_s
    return max(0.0, end - start)


def offered_load(jobs: list[TraceJob], gpus: int, after: float | None = None, before: float | None = None) -> float:
    """Sum of GPUs × run time over (the window's span × ``gpus``); 0 for an empty window."""
    length = span(jobs, after, before)
    if length <= 0 or gpus <= 0:
        return 0.0
    return sum(j.gpus * j.duration_s for j in jobs) / (length * gpus)


def in_window_load(jobs: list[TraceJob], gpus: int, after: float | None = None, before: float | None = None) -> float:
    """As ``offered_load``, but each job's run time cut at the window's end (as if it had
    started the moment it arrived)."""
    length = span(jobs, after, before)
    if length <= 0 or gpus <= 0:
        return 0.0
    end = before if before is not None else jobs[-1].submit_s
    return sum(j.gpus * max(0.0, min(j.duration_s, end - j.submit_s)) for j in jobs) / (length * gpus)


def nodes_for(jobs: list[TraceJob], gpus_per_node: int, load: float, after: float | None = None,
              before: float | None = None) -> int:
    """The fewest nodes of ``gpus_per_node`` that keep ``offered_load`` at or under ``load``,
    and enough to hold the widest job."""
    if not 0 < load <= 1 or gpus_per_node <= 0:
        raise ValueError(f"load: a share in (0, 1], got {load!r}; gpus_per_node: above 0, got {gpus_per_node!r}")
    demand = offered_load(jobs, 1, after, before)  # mean GPUs asked for over the window
    widest = max((j.gpus for j in jobs), default=0)
    return max(1, math.ceil(demand / (load * gpus_per_node)), math.ceil(widest / gpus_per_node))
