"""What reaches the loop from outside its thread: jobs just stored by the intake, and the
changes users ask for through the API (cancel, hold, release, requeue, scale, priority).
They are queued here and taken at the start of each cycle, on the loop's thread, so nothing
else ever touches the loop's memory. Each wish is also in the store (a cancel's
``cancel_requested_at``, a task's desired size), so one the loop has not taken when the
server stops is found again by the next server."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.queue import Queue
from corral.control.records import JobRec, load_records
from corral.control.scaling import Scaling
from corral.control.transitions import Transitions
from corral.states import JobState
from corral.store.tables import Job


@dataclass(frozen=True)
class Submitted:
    job: JobRec


@dataclass(frozen=True)
class Cancel:
    job_id: int


@dataclass(frozen=True)
class Hold:
    job_id: int


@dataclass(frozen=True)
class Release:
    job_id: int


@dataclass(frozen=True)
class Reprioritize:
    job_id: int


@dataclass(frozen=True)
class Requeue:
    job_id: int


@dataclass(frozen=True)
class Scale:
    job_id: int
    task: str
    replicas: int


Command = Submitted | Cancel | Hold | Release | Reprioritize | Requeue | Scale


class Commands:
    def __init__(self, book: Book, moves: Transitions, queue: Queue, scaling: Scaling):
        self.book, self.moves, self.queue, self.scaling = book, moves, queue, scaling
        self._inbox: deque[Command] = deque()
        self.rescan = False  # a command asks for the store's pending jobs to be read again

    def put(self, command: Command) -> None:
        self._inbox.append(command)  # deque appends are atomic: safe from any thread

    def __bool__(self) -> bool:
        return bool(self._inbox)

    def take(self, s: Session, now: float) -> tuple[list[int], list[int]]:
        """Carry out what was queued; returns the jobs to cancel and to requeue (done in their
        own steps, after what executors observed)."""
        cancels: list[int] = []
        requeues: list[int] = []
        while self._inbox:
            command = self._inbox.popleft()
            if isinstance(command, Submitted):
                if not command.job.hold:  # submitted held: it joins the queue when released
                    self.queue.enqueue(command.job, now)
            elif isinstance(command, Scale):
                job = self.book.active.get(command.job_id)
                if job is not None:
                    self.scaling.reconcile(s, job, command.task, command.replicas, now)
            elif isinstance(command, Hold):
                self.queue.leave(command.job_id)  # its reason shows again once released
            elif isinstance(command, Release):
                self.rescan = True  # read back into the queue
            elif isinstance(command, Reprioritize):  # read back, with its new priority
                self.queue.leave(command.job_id)
                self.book.sched_needed = self.rescan = True
            elif isinstance(command, Requeue):
                requeues.append(command.job_id)
            else:
                cancels.append(command.job_id)
        return cancels, requeues

    @staticmethod
    def requested_cancels(s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.cancel_requested_at.is_not(None),
            Job.state.in_([JobState.PENDING.value, JobState.STARTING.value, JobState.RUNNING.value]))))

    @staticmethod
    def requested_requeues(s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.requeue_requested_at.is_not(None),
            Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value]))))

    def cancel(self, s: Session, job_ids: list[int], now: float) -> None:
        """A pending job ends CANCELLED at once; an active one is marked, and stops (every
        replica with its grace period) when its job is evaluated this cycle."""
        book = self.book
        for job_id in job_ids:
            if job_id in book.cancels_seen:
                continue
            if job_id in book.active:
                book.cancels_seen.add(job_id)
                book.active[job_id].cancel_requested = True
                book.dirty.add(job_id)
                continue
            self.queue.leave(job_id)
            job = load_records(s, [job_id]).get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue  # not ours yet or already over; the rescan looks again
            book.cancels_seen.add(job_id)
            self.moves.kill_all(job, JobState.CANCELLED, now, "cancel", "cancelled while pending")
