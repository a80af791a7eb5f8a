"""Reservations for blocked jobs, and the check that a backfilled job delays none of them.

A reservation is a what-if: release running jobs in the order of their expected ends (start
+ time limit) on a copy of the free pool until the blocked gang fits; the time is its
reserved start, and the pool left at that time (after placing it) is what later jobs may
still use then. A reservation holds its GPUs from now until its own expected end (start +
time limit), as Slurm's backfill map does: later reservations may plan on them after that,
so a long queue of gangs each gets a place in time instead of the first few taking every
node for good. A lower-priority job may start now only if, for every reservation it would
overlap in time, it also fits into that reservation's leftover pool; it is then assumed
there too, so the next candidate sees it. Nothing here mutates the caller's pools unless it
says so; failed what-ifs are always undone."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
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
    end: float = INFINITY  # start + the job's planned run time: when its hold on the GPUs ends
    # Backfill around it plans with time limits, not predicted run times: a job that runs
    # longer than predicted must not push this start back (a starving job's reservation).
    strict: bool = False


Step = tuple[float, tuple[Allocation, ...], int]  # (time, allocations given back, their GPUs)


class Timeline:
    """Future releases of resources: (time, allocations) sorted by time — running jobs'
    expected ends, and reservations' hold ends. ``changes`` logs the time of every release
    added, so a book can tell which of its checkpoints went stale."""

    def __init__(self) -> None:
        self.releases: list[Step] = []
        self.times: list[float] = []  # the releases' times, kept beside them for bisecting
        self.changes: list[float] = []
        self._sorted = True

    def add(self, end: float, allocations: tuple[Allocation, ...]) -> None:
        step = (end, allocations, sum(len(a.gpus) for a in allocations))
        if self._sorted:  # after equal times, as a stable sort would put it
            at = bisect_right(self.times, end)
            self.times.insert(at, end)
            self.releases.insert(at, step)
        else:
            self.releases.append(step)
        self.changes.append(end)

    def ordered(self) -> list[Step]:
        if not self._sorted:
            self.releases.sort(key=_time)
            self.times = [step[0] for step in self.releases]
            self._sorted = True
        return self.releases

    def load(self, releases) -> None:
        """Many releases at once (the running jobs), sorted once rather than one by one."""
        self._sorted = False
        for end, allocations in releases:
            self.add(end, allocations)
        self.ordered()


class Book:
    """The reservations of one cycle, with the free pool as it is now minus everything they
    hold (kept current, so a new reservation starts from a copy instead of redoing all the
    earlier ones).

    Walking the timeline is the cost of a reservation, so the book keeps checkpoints: the
    pool after the first k releases, every ``EVERY`` steps, with how many of the book's
    changes (starts and held reservations, ``deltas``) it has seen. A later reservation
    resumes from the last checkpoint at which its gang certainly could not fit yet (by a
    count of GPUs), replays the newer deltas, and walks on from there."""

    EVERY = 8

    def __init__(self, pool: FreePool):
        self.reservations: list[Reservation] = []
        self.base = pool.copy()
        self.held: dict[str, dict[int, float]] = {}  # node -> GPU -> when its last hold ends
        self.deltas: list[Allocation] = []
        self._points: dict[int, tuple[FreePool, int]] = {}
        self._seen_changes = 0
        self._released: list[int] = []  # GPUs released by steps 0..i (prefix sums), ignoring holds
        # Per gang shape, the step of its last reservation: holds and starts only ever take
        # resources away during a cycle, so the same shape never fits any earlier.
        self._floor: dict[tuple, int | None] = {}

    def __bool__(self) -> bool:
        return bool(self.reservations)

    def __len__(self) -> int:
        return len(self.reservations)

    def add(self, reservation: Reservation, timeline: Timeline) -> None:
        self.reservations.append(reservation)
        end = reservation.end
        for alloc in reservation.allocations:  # pessimistic: held from now, not from its start
            self.base.take(alloc)
            holds = self.held.setdefault(alloc.node, {})
            for gpu in alloc.gpus:
                if holds.get(gpu, -INFINITY) < end:
                    holds[gpu] = end
            self.deltas.append(alloc)
        if end < INFINITY:
            timeline.add(end, reservation.allocations)

    def started(self, allocations: tuple[Allocation, ...]) -> None:
        for alloc in allocations:
            self.base.take(alloc)
            self.deltas.append(alloc)

    def _sync(self, timeline: Timeline) -> list[Step]:
        steps = timeline.ordered()
        if self._seen_changes != len(timeline.changes) or len(self._released) != len(steps):
            new = timeline.changes[self._seen_changes:]
            cut = 0
            if new:  # checkpoints and prefix sums before the earliest new release still hold
                cut = bisect_left(steps, min(new), key=_time)
                self._points = {k: v for k, v in self._points.items() if k < cut}
            self._seen_changes = len(timeline.changes)
            del self._released[cut:]
            total = self._released[-1] if self._released else 0
            self._released.extend(accumulate((s[2] for s in steps[cut:]), initial=total))
            del self._released[cut]  # accumulate repeats its initial value first
        return steps

    def _release(self, trial: FreePool, step: Step) -> None:
        at, allocations, _ = step
        for alloc in allocations:
            holds = self.held.get(alloc.node)
            if holds:  # a GPU comes back only once every hold on it has ended (a hold end too)
                trial.release_except(alloc, {g for g in alloc.gpus if holds.get(g, -INFINITY) > at})
            else:
                trial.release(alloc)


def reserve(job: PendingJob, book: Book, timeline: Timeline, now: float, scope: Scope = EVERYWHERE
            ) -> Reservation | None:
    """The earliest start of ``job`` given the releases and the book's reservations, or
    None if it never fits."""
    steps = book._sync(timeline)
    shape = _shape(job, scope)
    if shape in book._floor and book._floor[shape] is None:
        return None  # the same gang found no room at all earlier in this cycle
    need = job.gpus
    free_now = book.base.free_gpus
    # the last step before which the gang cannot fit, whatever the holds: count bound
    sure = bisect_left(book._released, need - free_now) - 1  # prefix sums never fall
    floor = book._floor.get(shape)
    if floor is not None:
        sure = max(sure, floor - 1)
    if free_now < need or floor is not None:
        start = max((k for k in book._points if k <= sure), default=None)
    else:
        start, sure = None, -2
    if start is None:
        trial, index = book.base.copy(), -1
    else:
        point, seen = book._points[start]
        if seen < len(book.deltas):  # bring the checkpoint up to date once, for every later user
            for alloc in book.deltas[seen:]:
                point.take(alloc)
            book._points[start] = (point, len(book.deltas))
        trial, index = point.copy(), start
    while True:
        if index > sure and trial.free_gpus >= need and \
                all(trial.slots(t.gpus) >= t.replicas for t in job.tasks if t.gpus):
            placed = place_gang(trial, job, scope)
            if placed is not None:
                book._floor[shape] = index
                start = max(now, steps[index][0]) if index >= 0 else now
                end = start + job.run_s if job.run_s is not None else INFINITY
                return Reservation(job.id, start, placed, trial, end)
        index += 1
        if index >= len(steps):
            book._floor[shape] = None
            return None
        book._release(trial, steps[index])
        if index % Book.EVERY == Book.EVERY - 1 and index not in book._points:
            book._points[index] = (trial.copy(), len(book.deltas))


def _time(step: Step) -> float:
    return step[0]


def _shape(job: PendingJob, scope: Scope) -> tuple:
    relaxes = any(t.topology is not None and t.topology.max_wait is not None for t in job.tasks)
    # everything of a task that decides where it fits: two gangs alike in all of it fit alike
    return (tuple((t.replicas, t.gpus, t.cpus, t.memory, t.gpu_type, t.topology, t.ports, t.constraint, t.nodes,
                   t.exclusive, t.distinct, t.gang, t.avoid) for t in job.tasks),
            scope.allowed, scope.levels, scope.waited if relaxes else None)


def fits_around(job: PendingJob, allocations: tuple[Allocation, ...], now: float, book: Book) -> bool:
    """True if starting ``job`` now on ``allocations`` delays no reservation; on success
    the job is assumed into every reservation it overlaps."""
    end = now + (job.run_s if job.run_s is not None else INFINITY)
    latest = now + (job.time_limit if job.time_limit is not None else INFINITY)
    overlapping = [r for r in book.reservations if (latest if r.strict else end) > r.start]
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
