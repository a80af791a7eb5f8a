"""State moves of jobs and replicas, each checked against the transition tables
(``corral.states``) and written to the journal with its cause, so ``corral events JOB``
tells the job's story. The only place the loop changes a state; what a move makes happen
outside the store (a signal, a release) is queued as an effect and done after the commit."""

from __future__ import annotations

from corral.control.book import Book
from corral.control.journal import Journal
from corral.control.records import JobRec, ReplicaRec
from corral.states import JobState, ReplicaState, check_job_transition, check_replica_transition


class Transitions:
    def __init__(self, book: Book, journal: Journal):
        self.book = book
        self.journal = journal

    def replica_to(self, replica: ReplicaRec, new: ReplicaState, cause: str, now: float,
                   message: str | None = None, **columns: object) -> None:
        old = replica.state
        check_replica_transition(old, new)
        replica.state = new
        if "exit_code" in columns:
            replica.exit_code = columns["exit_code"]  # type: ignore[assignment]
        if new.terminal:
            self.book.free(replica.id)
        self.journal.replica(replica.id, state=new.value, **columns)
        self.journal.event(replica.job_id, now, replica.label, cause, old.value, new.value, message)

    def job_to(self, job: JobRec, new: JobState, now: float, cause: str, event_message: str | None,
               **columns: object) -> None:
        """Move a job the loop owns (claimed, or pending and never claimed): only the loop's
        thread writes job states, so the write goes through the journal like any other."""
        old = job.state
        check_job_transition(old, new)
        job.state = new
        values = {"state": new.value, **columns}
        if new.terminal:
            values["ended_at"] = now
            self.book.sched_needed = True  # jobs may depend on this one
        self.journal.job(job.id, **values)
        self.journal.event(job.id, now, "job", cause, old.value, new.value, event_message)

    def kill_all(self, job: JobRec, new: JobState, now: float, cause: str, why: str, **columns: object) -> None:
        """End a job that never ran (or whose replicas are all down): every replica KILLED."""
        self.job_to(job, new, now, cause, why, **columns)
        for replica in job.replicas:
            if not replica.state.terminal:
                self.replica_to(replica, ReplicaState.KILLED, cause, now, ended_at=now)

    def event(self, job_id: int, now: float, subject: str, cause: str, message: str | None = None) -> None:
        self.journal.event(job_id, now, subject, cause, message=message)
