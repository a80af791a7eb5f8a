"""Pipelines (a multi-document file without ``execution: parallel``): one job whose tasks are
stages run in file order, each placed when the one before it has succeeded, so stages need
not fit the pool together. Between stages the job gives back what the stage held and waits
in the queue (same id, names and checkpoint directory) for the next stage's resources."""

from __future__ import annotations

from corral.control.book import Book
from corral.control.effects import Effects
from corral.control.queue import Queue
from corral.control.records import JobRec
from corral.control.transitions import Transitions
from corral.states import JobState, ReplicaState


class Pipelines:
    def __init__(self, book: Book, moves: Transitions, effects: Effects, queue: Queue):
        self.book, self.moves, self.effects, self.queue = book, moves, effects, queue

    def next_stage(self, job: JobRec, now: float) -> bool:
        """A pipeline whose current stage has just succeeded, with stages to come, goes back
        to the queue for the next one; True if it did."""
        if not job.pipeline or job.state != JobState.RUNNING or job.cancel_requested:
            return False
        current = job.stage()[0]
        if current is job.tasks[0] or any(r.state != ReplicaState.PENDING for r in job.replicas_of(current.name)):
            return False  # still in its first stage, or the stage has started
        for replica in job.members:
            self.book.allocs.pop(replica.id, None)
        self.book.active.pop(job.id)
        self.book.publish.discard(job.id)
        self.effects.release(job.id)
        job.forget_request()
        position = job.tasks.index(current)
        self.moves.job_to(job, JobState.PENDING, now, "next_stage",
                          f"stage {position} of {len(job.tasks)} done; stage {position + 1} ({current.name}) waits "
                          "for its resources", reason="None")
        self.book.sched_needed = True
        self.queue.enqueue(job, now)
        return True
