"""The audit trail: who (user, role, address or ``local``) did what (submit, cancel, hold,
release, requeue, scale, priority, exec and shell into a replica, token_create, token_revoke)
to which job or token, when, and whether it was allowed.

An entry is written in the transaction of the change it records (``add``): the job, the hold,
the token and its entry commit together or not at all, so no crash, kill or failed commit
leaves a change without its entry or an entry without its change. Submissions are stored in
batches by ``api.intake``, and their entries with them, in the batch's transaction (no commit
of their own). What changes nothing (a refusal) is written in a short transaction of its own
(``record``) before the request is answered; a refusal whose entry cannot be written (the
database refusing a connection under load) is still answered as the refusal it is, and the
lost entry logged, rather than turned into a server error (what opens a shell is not: its
entry is written or it is not opened)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from corral.auth.roles import Identity
from corral.store.tables import AuditEntry

ACTIONS = ("submit", "cancel", "hold", "release", "requeue", "scale", "priority", "exec", "shell", "token_create",
           "token_revoke")
_INSERT = insert(AuditEntry.__table__)
log = logging.getLogger(__name__)


class Auditor:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float]):
        self.sessions = sessions
        self.clock = clock

    def entry(self, who: Identity, action: str, target: str | None, outcome: str = "ok",
              detail: str | None = None) -> dict[str, Any]:
        """The row of an entry, stamped now (what ``add`` and the intake insert)."""
        return {"ts": self.clock(), "user": who.user, "role": who.role.value, "source": who.source[:64],
                "action": action, "target": target, "outcome": outcome, "detail": detail}

    def add(self, session: Session, who: Identity, action: str, target: str | None, outcome: str = "ok",
            detail: str | None = None) -> None:
        """Write an entry in ``session``'s transaction: it commits with the change it records."""
        insert_entries(session, [self.entry(who, action, target, outcome, detail)])

    def record(self, who: Identity, action: str, target: str | None, outcome: str = "ok",
               detail: str | None = None) -> None:
        """Write an entry that goes with no change (a refusal), in a transaction of its own."""
        try:
            with self.sessions() as session:
                self.add(session, who, action, target, outcome, detail)
                session.commit()
        except SQLAlchemyError:
            if outcome != "refused":
                raise
            log.exception("audit: the entry of %s's refused %s (%s) could not be written", who.user, action,
                          target or "-")


def insert_entries(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(_INSERT, rows)


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
