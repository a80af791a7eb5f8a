"""The audit trail: who (user, role, address or ``local``) did what (submit, cancel, hold,
release, requeue, scale, priority, token_create, token_revoke) to which job or token, when,
and whether it was allowed.

Entries are written by one thread in batches, like submissions (``api.intake``): a route
hands its entry over without waiting for a commit of its own, so auditing costs a submission
nothing measurable. ``flush`` waits until everything handed over is stored (the audit route
calls it, so a reader sees every action that answered before it asked)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from corral.auth.roles import Identity
from corral.store.tables import AuditEntry

log = logging.getLogger(__name__)

GATHER_S = 0.05
ACTIONS = ("submit", "cancel", "hold", "release", "requeue", "scale", "priority", "token_create", "token_revoke")


class Auditor:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float]):
        self.sessions = sessions
        self.clock = clock
        self._queue: queue.SimpleQueue[AuditEntry | Future | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, who: Identity, action: str, target: str | None, outcome: str = "ok",
               detail: str | None = None) -> None:
        self._ensure_started()
        self._queue.put(AuditEntry(ts=self.clock(), user=who.user, role=who.role.value, source=who.source[:64],
                                   action=action, target=target, outcome=outcome, detail=detail))

    def flush(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        done: Future = Future()
        self._queue.put(done)
        done.result(timeout)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _ensure_started(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="corral-audit", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[AuditEntry | Future | None] = [self._queue.get()]
            # Gather what arrives within GATHER_S into one transaction (unless someone waits on a
            # flush): a flood of submissions then costs the store a few audit commits a second,
            # not one each, and leaves its write lock to the intake.
            deadline = time.monotonic() + (0 if isinstance(batch[0], (Future, type(None))) else GATHER_S)
            while len(batch) < 1000:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                batch.append(item)
                if not isinstance(item, AuditEntry):
                    deadline = 0.0  # a flush or a stop: write now
            stopping = None in batch
            entries = [e for e in batch if isinstance(e, AuditEntry)]
            if entries:
                try:
                    with self.sessions() as session:
                        session.add_all(entries)
                        session.commit()
                except Exception:
                    log.exception("could not store %d audit entries", len(entries))
            for waiter in batch:
                if isinstance(waiter, Future):
                    waiter.set_result(None)


def entries(session: Session, *, since: float | None = None, user: str | None = None, action: str | None = None,
            limit: int = 1000, after: int | None = None) -> list[AuditEntry]:
    """Entries in id order, filtered: with ``after`` (a cursor) the page of ids above it, else
    the newest ``limit``."""
    query = select(AuditEntry)
    if since is not None:
        query = query.where(AuditEntry.ts >= since)
    if user:
        query = query.where(AuditEntry.user == user)
    if action:
        query = query.where(AuditEntry.action == action)
    if after is None:
        newest = session.scalars(query.order_by(AuditEntry.id.desc()).limit(limit))
        return sorted(newest, key=lambda e: e.id)
    return list(session.scalars(query.where(AuditEntry.id > after).order_by(AuditEntry.id).limit(limit)))
