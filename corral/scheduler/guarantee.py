"""Reservations that hold whatever the predictions say: for jobs owed their turn.

When the policy plans with learned run times (``Policy.learn_durations``), a reservation's
start is computed from running jobs' *predicted* ends, and backfill lets a job in when its
*predicted* end comes before that start. Predictions are often short, so such a start is a
hope, not a promise: a job that outruns its prediction pushes the reservation back, and the
next cycle's reservation, again computed from predictions, can be pushed back again. For
most jobs that trade is worth it (shorter waits on average). For a starving job
(``PriorityWeights.starve_after_s``) it is not: it is owed a bound.

So a starving job's reservation is computed as Slurm computes every reservation: running
jobs give their resources back at their time limits (``RunningJob.latest_end``), and jobs
started in this cycle at theirs. It is marked ``strict``, so backfill checks a candidate
against it with the candidate's time limit. Nothing that starts after it can then delay it,
and it starts at the latest when the jobs running on its nodes reach their limits: the bound
on its wait is its starve threshold plus the longest time limit among those jobs (plus the
same for every starving job ahead of it in its tier).

Built lazily: a cycle with no starving job, or a policy that plans with time limits anyway,
never pays for the second timeline."""

from __future__ import annotations

from corral.scheduler.backfill import INFINITY, Book, Reservation, Timeline, reserve
from corral.scheduler.placement import EVERYWHERE, Scope
from corral.scheduler.plan import Allocation
from corral.scheduler.snapshot import PendingJob, RunningJob


class Guarantees:
    def __init__(self, running: tuple[RunningJob, ...]):
        self._running = running
        self._started: list[tuple[float, tuple[Allocation, ...]]] = []
        self._book: Book | None = None
        self._timeline: Timeline | None = None

    def started(self, job: PendingJob, allocations: tuple[Allocation, ...], now: float) -> None:
        """A job started (or was assumed) in this cycle; it frees its resources by its limit."""
        end = now + job.time_limit if job.time_limit is not None else INFINITY
        if self._book is None:
            self._started.append((end, allocations))
        else:
            self._book.started(allocations)
            self._timeline.add(end, allocations)

    def reserve(self, job: PendingJob, book: Book, now: float, scope: Scope = EVERYWHERE) -> Reservation | None:
        """The start ``job`` is sure of, given time limits; ``book`` is the cycle's own, whose
        free pool (with every reservation so far held) this starts from."""
        if self._book is None:
            self._timeline = Timeline()
            self._timeline.load([(r.latest_end, r.allocations) for r in self._running] + self._started)
            self._book = Book(book.base)
            for r in book.reservations:  # reservations made before: held until their own ends
                if r.end < INFINITY:
                    self._timeline.add(r.end, r.allocations)
        reservation = reserve(job, self._book, self._timeline, now, scope)
        if reservation is not None:
            reservation.strict = True
        return reservation

    def add(self, reservation: Reservation, book: Book) -> None:
        """A reservation (strict or not) the cycle keeps: held in the strict plan too."""
        if self._book is not None:
            self._book.add(reservation, self._timeline)
