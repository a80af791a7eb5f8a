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

from corral.scheduler.placement import EVERYWHERE, FreePool, Scope, place_gang
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


class Book:
    """The reservations of one cycle, with the free pool as it is now minus everything they
    hold (kept current, so a new reservation starts from a copy instead of redoing all the
    earlier ones)."""

    def __init__(self, pool: FreePool):
        self.reservations: list[Reservation] = []
        self.base = pool.copy()
        self.held: dict[str, set[int]] = {}

    def __bool__(self) -> bool:
        return bool(self.reservations)

    def __len__(self) -> int:
        return len(self.reservations)

    def add(self, reservation: Reservation) -> None:
        self.reservations.append(reservation)
        for alloc in reservation.allocations:  # pessimistic: held from now on
            self.base.take(alloc)
            self.held.setdefault(alloc.node, set()).update(alloc.gpus)

    def started(self, allocations: tuple[Allocation, ...]) -> None:
        for alloc in allocations:
            self.base.take(alloc)


def reserve(job: PendingJob, book: Book, timeline: Timeline, now: float, scope: Scope = EVERYWHERE
            ) -> Reservation | None:
    """The earliest start of ``job`` given the releases and the book's reservations, or
    None if it never fits. One working pool walks forward in time; a release never hands
    back a GPU a reservation holds; cheap bounds skip most what-ifs."""
    trial = book.base.copy()
    for end, allocations in [(now, ())] + timeline.ordered():
        for alloc in allocations:
            reserved = book.held.get(alloc.node)
            if reserved:
                alloc = Allocation(alloc.task, alloc.rank, alloc.node, tuple(g for g in alloc.gpus if g not in reserved),
                                   alloc.cpus, alloc.memory)
            trial.release(alloc)
        if trial.free_gpus < job.gpus or any(trial.count_with(t.gpus) < t.replicas for t in job.tasks if t.gpus):
            continue
        placed = place_gang(trial, job, scope)
        if placed is not None:
            return Reservation(job.id, max(now, end), placed, trial)
    return None


def fits_around(job: PendingJob, allocations: tuple[Allocation, ...], now: float, book: Book) -> bool:
    """True if starting ``job`` now on ``allocations`` delays no reservation; on success
    the job is assumed into every reservation it overlaps."""
    end = now + (job.time_limit if job.time_limit is not None else INFINITY)
    overlapping = [r for r in book.reservations if end > r.start]
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
