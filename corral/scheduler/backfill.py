"""Reservations for blocked jobs, and the check that a backfilled job delays none of them.

A reservation is a what-if: release running jobs in the order of their expected ends (start
+ time limit) on a copy of the free pool until the blocked gang fits; the time is its
reserved start, and the pool left at that time (after placing it) is what later jobs may
still use then. A lower-priority job may start now only if, for every reservation it would
overlap in time, it also fits into that reservation's leftover pool; it is then assumed
there too, so the next candidate sees it. Nothing here mutates the caller's pools unless it
says so; failed what-ifs are always undone."""

from __future__ import annotations

from dataclasses import dataclass

from corral.scheduler.placement import FreePool, place_gang
from corral.scheduler.plan import Allocation
from corral.scheduler.snapshot import PendingJob

INFINITY = float("inf")


@dataclass
class Reservation:
    job_id: int
    start: float
    allocations: tuple[Allocation, ...]
    leftover: FreePool  # free resources at ``start`` once the reserved gang is placed


class Timeline:
    """Future releases of resources: (time, allocations) sorted by time."""

    def __init__(self) -> None:
        self.releases: list[tuple[float, tuple[Allocation, ...]]] = []

    def add(self, end: float, allocations: tuple[Allocation, ...]) -> None:
        self.releases.append((end, allocations))
        self._sorted = False

    def ordered(self) -> list[tuple[float, tuple[Allocation, ...]]]:
        if not getattr(self, "_sorted", False):
            self.releases.sort(key=lambda r: r[0])
            self._sorted = True
        return self.releases


def reserve(job: PendingJob, pool: FreePool, timeline: Timeline, reservations: list[Reservation],
            now: float) -> Reservation | None:
    """The earliest start of ``job`` given the releases and earlier reservations (which
    keep their resources from their start on), or None if it never fits."""
    future = pool.copy()
    held = [a for r in reservations for a in r.allocations]
    need = job.gpus
    free = sum(len(n.gpus) for n in future.nodes) - sum(len(a.gpus) for a in held)
    for end, allocations in [(now, ())] + timeline.ordered():
        for alloc in allocations:
            future.release(alloc)
            free += len(alloc.gpus)
        if free < need:  # cheap bound first: not enough GPUs in all, no what-if placement
            continue
        trial = future.copy()
        for alloc in held:  # pessimistic: earlier reservations hold theirs from now on
            _take(trial, alloc)
        placed = place_gang(trial, job)
        if placed is not None:
            return Reservation(job.id, max(now, end), placed, trial)
    return None


def fits_around(job: PendingJob, allocations: tuple[Allocation, ...], now: float,
                reservations: list[Reservation]) -> bool:
    """True if starting ``job`` now on ``allocations`` delays no reservation; on success
    the job is assumed into every reservation it overlaps."""
    end = now + (job.time_limit if job.time_limit is not None else INFINITY)
    overlapping = [r for r in reservations if end > r.start]
    taken: list[tuple[Reservation, Allocation]] = []
    for reservation in overlapping:
        for alloc in allocations:
            try:
                reservation.leftover.assume(alloc)
            except ValueError:
                for r, a in taken:
                    r.leftover.release(a)
                return False
            taken.append((reservation, alloc))
    return True


def _take(pool: FreePool, alloc: Allocation) -> None:
    """Remove a reserved allocation even where the what-if has not freed it yet (it may
    still be held now): the reservation owns it from its start on."""
    node = pool.by_name[alloc.node]
    node.gpus -= set(alloc.gpus)
    node.cpus -= alloc.cpus
    node.memory -= alloc.memory
