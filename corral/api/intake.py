"""Stores accepted submissions in groups: one writer thread takes every submission waiting,
inserts them all in one transaction, gives each the domain of its replicas' names against the
active jobs (and each other) at once, commits once, then answers each waiting request. A request gets 201 only
after its job is committed, so an acknowledged job is stored exactly once; a failed batch is
retried one job per transaction so one bad row cannot sink its neighbours. A submission's
audit entries (``auth.audit``) are inserted with its job, in the same transaction: a job is
never stored without its entry, nor an entry without its job.

Why a single writer rather than a lock around each request's insert: 16 clients used to queue
on the control loop's lock for a commit each (≈170/s); one commit per batch and no lock shared
with the loop lifts that by an order of magnitude, as group commit does in databases."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy.orm import Session, sessionmaker

from corral.auth.audit import insert_entries
from corral.runtime.discovery import choose_domain
from corral.store import repository
from corral.store.repository import NewJob

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    job: NewJob
    future: Future
    more: tuple[NewJob, ...] = ()  # the other elements of a job array, stored with ``job``
    audit: tuple[dict, ...] = ()  # audit rows (``Auditor.entry``) to store with it, about its (first) job

    @property
    def jobs(self) -> list[NewJob]:
        return [self.job, *self.more]


class Intake:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float],
                 stored: Callable[[SimpleNamespace], None], max_batch: int = 512,
                 arriving: Callable[[], None] | None = None):
        self.sessions = sessions
        self.clock = clock
        self.stored = stored  # hands each committed job to the control loop
        self.arriving = arriving  # told as a submission comes in, before it is stored
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: NewJob, *more: NewJob, audit: tuple[dict, ...] = ()) -> Future:
        """A future of the stored job (a row-shaped object with ids and its ``domain``); with
        ``more`` (a job array's other elements, sharing its name), of the list of all of them.
        ``audit``: entries stored in the job's transaction, their target set to it."""
        self._ensure_started()
        if self.arriving is not None:
            self.arriving()
        pending = _Pending(job, Future(), tuple(more), tuple(audit))
        self._queue.put(pending)
        return pending.future

    def _ensure_started(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="corral-intake", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(item)
            try:
                self._store(batch)
            except Exception:
                log.exception("storing %d submissions at once failed; storing them one by one", len(batch))
                for item in batch:
                    if not item.future.done():
                        try:
                            self._store([item])
                        except Exception as exc:  # this one cannot be stored: its request gets an error
                            item.future.set_exception(exc)

    def _store(self, batch: list[_Pending]) -> None:
        now = self.clock()
        with self.sessions() as session:
            flat = repository.create_jobs(session, [j for p in batch for j in p.jobs], now)
            rows, at = [], 0
            for item in batch:
                rows.append(flat[at] if not item.more else flat[at:at + len(item.jobs)])
                at += len(item.jobs)
            self._name(session, batch, flat)
            entries = []
            for item, row in zip(batch, rows):
                target = f"job {(row[0] if item.more else row).id}"  # an array: its first element
                entries.extend({**entry, "target": target} for entry in item.audit)
            insert_entries(session, entries)
            session.commit()
        # Committed: from here on nothing may send the batch round again.
        try:
            for one in flat:
                self.stored(one)
        except Exception:  # the loop's rescan finds the stored jobs anyway
            log.exception("handing stored jobs to the control loop failed")
        for item, row in zip(batch, rows):
            if not item.future.done():
                item.future.set_result(row)

    @staticmethod
    def _name(session: Session, batch: list[_Pending], flat: list[SimpleNamespace]) -> None:
        """Give each job of the batch (just inserted, in submit order) the domain of its replica
        names: its name unless an active job of its user, or one earlier in the batch, holds it
        (``runtime.discovery.choose_domain``). One query for the batch; one update more only
        when a job's domain is not its name. Every element of an array is a job of its own,
        each named apart, as two submissions of one script are."""
        names = {row.name for row in flat}
        taken = repository.active_domains(session, names | {f"{row.name}-{row.id}" for row in flat},
                                          domains=names, skip=(row.id for row in flat))
        chosen: dict[int, str] = {}
        for row in flat:
            mine = taken.setdefault(row.user, {})
            domain = choose_domain(row.name, row.id, mine)
            mine.setdefault(domain, row.name)
            if domain != row.name:
                row.domain = chosen[row.id] = domain
        repository.set_domains(session, chosen)
