"""The pending queue the scheduler reads: jobs handed over by the intake as they are
stored, and, as a safety net, every pending job the store holds (another writer, ids
committed out of order on PostgreSQL), re-read every ``rescan_interval_s``. A job the loop
cannot read or run fails at once with the reason (one bad row must not stop the loop for
everyone); a held job stays out of the queue until released."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.records import JobRec, load_records
from corral.control.transitions import Transitions
from corral.states import JobState
from corral.store.tables import Job

log = logging.getLogger("corral.control")


class Queue:
    def __init__(self, book: Book, moves: Transitions):
        self.book, self.moves = book, moves
        self.arrivals = False  # new jobs joined since the last scheduling pass

    def enqueue(self, job: JobRec, now: float) -> None:
        pending = self.book.pending
        if job.id in pending or job.id in self.book.active or job.state != JobState.PENDING or job.hold:
            return
        problem = unusable(job)
        if problem is not None:  # one bad job must not stop the loop for everyone
            self.moves.kill_all(job, JobState.FAILED, now, "invalid", problem, reason="InvalidSpec", message=problem)
            return
        self.arrivals = True
        in_order = not pending or job.id > next(reversed(pending))
        pending[job.id] = job
        if not in_order:
            self.book.pending = dict(sorted(pending.items()))

    def leave(self, job_id: int) -> JobRec | None:
        """A job leaves the queue (held, started, cancelled, or to be read again)."""
        self.book.reasons.pop(job_id, None)
        job = self.book.pending.pop(job_id, None)
        if job is not None:
            self.book.sched_needed = True
        return job

    def ingest(self, s: Session, now: float) -> None:
        """Every pending job of the store, so nothing another writer added is missed."""
        ids = set(s.scalars(select(Job.id).where(Job.state == JobState.PENDING.value,
                                                 Job.cancel_requested_at.is_(None), Job.hold == "")))
        for gone in set(self.book.pending) - ids:
            self.book.pending.pop(gone, None)
        new = sorted(ids - set(self.book.pending))
        try:
            loaded = load_records(s, new) if new else {}
        except Exception:  # a row the loop cannot even read: load one by one, fail the bad ones
            loaded = {}
            for job_id in new:
                try:
                    loaded.update(load_records(s, [job_id]))
                except Exception as exc:
                    log.exception("job %s cannot be loaded; failing it", job_id)
                    self._fail_unreadable(job_id, f"{type(exc).__name__}: {exc}", now)
        for job in loaded.values():
            self.enqueue(job, now)

    def _fail_unreadable(self, job_id: int, why: str, now: float) -> None:
        message = f"corral cannot read this job ({why[:300]})"
        self.moves.journal.job(job_id, state=JobState.FAILED.value, ended_at=now, reason="InvalidSpec", message=message)
        self.moves.journal.event(job_id, now, "job", "invalid", JobState.PENDING.value, JobState.FAILED.value, message)


def unusable(job: JobRec) -> str | None:
    """Why the loop could not schedule or run this job (a row stored by an older version, or
    written around the API), or None."""
    try:
        job.request  # noqa: B018 - builds and validates what the scheduler reads
        for task in job.tasks:
            task.service  # noqa: B018
            for key in ("setup", "run", "workdir"):
                value = task.spec.get(key)
                if key == "workdir" and isinstance(value, dict):  # a repository: its URL is what runs
                    value = value.get("url")
                if value is not None and (not isinstance(value, str) or "\0" in value):
                    return f"task {task.name!r}: {key} cannot be run (not text, or holds a NUL byte)"
    except Exception as exc:
        return f"invalid stored job: {type(exc).__name__}: {str(exc)[:300]}"
    return None
