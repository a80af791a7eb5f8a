"""Bearer tokens: issued, verified, listed and revoked.

A token is ``corral_`` and 256 random bits. The store keeps only its SHA-256: a slow password
hash (bcrypt, scrypt) exists to make guessing a *low-entropy* secret expensive, and nobody can
guess 256 random bits however fast the hash is; a fast digest lets every request be checked
in microseconds. Whoever reads the database learns no token.

One server runs per database (``store.database.Claim``) and every token is created and revoked
through it, so ``TokenBook`` keeps the table in memory, written through to the store: a request
is authenticated without a database round trip, yet a revocation holds from the next request.
Expiry is checked against the server's clock. The owner's local token (``corral.credentials``)
never enters the store: it lives only in the server's memory and its 0600 file."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from corral.store.tables import ApiToken

PREFIX = "corral_"
Audit = Callable[[Session, "TokenRecord"], None]  # writes a change's audit entry in its transaction
TOUCH_EVERY_S = 60.0  # last-used times are written at most this often per token


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": 'Bearer realm="corral"'})


def missing() -> HTTPException:
    return unauthorized("this corral server needs a token (Authorization: Bearer TOKEN): `corral login "
                        "SERVER` saves one for the CLI and SDK; on the server's machine its owner's commands "
                        "use CORRAL_HOME/local.token")


@dataclass
class TokenRecord:
    id: int
    user: str
    role: str | None
    created_by: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    note: str | None

    @classmethod
    def of(cls, row: ApiToken) -> TokenRecord:
        return cls(row.id, row.user, row.role, row.created_by, row.created_at, row.expires_at, row.revoked_at,
                   row.last_used_at, row.note)


class TokenBook:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float], local_token: str | None):
        self.sessions = sessions
        self.clock = clock
        self.local_token = local_token
        self._lock = threading.Lock()
        with sessions() as session:
            rows = session.scalars(select(ApiToken)).all()
            self._by_digest = {row.digest: TokenRecord.of(row) for row in rows}
        self._by_id = {r.id: r for r in self._by_digest.values()}

    def is_local(self, token: str) -> bool:
        return self.local_token is not None and hmac.compare_digest(token.encode(), self.local_token.encode())

    def verify(self, token: str) -> TokenRecord:
        """The live token's record; a 401 saying why otherwise (unknown, revoked, expired)."""
        record = self._by_digest.get(digest(token))
        if record is None:
            raise unauthorized("the token is not valid on this server (mistyped, or from another server); "
                               "ask an admin for one (`corral token create`) and `corral login` with it")
        if record.revoked_at is not None:
            raise unauthorized(f"token {record.id} (of {record.user}) was revoked; ask an admin for a new one")
        if record.expires_at is not None and record.expires_at <= self.clock():
            raise unauthorized(f"token {record.id} (of {record.user}) expired; ask an admin for a new one")
        return record

    def refusal(self, authorization: str | None) -> HTTPException | None:
        """Why a request with this ``Authorization`` header is refused (401), or None when its
        token is the local one or a live one (read as FastAPI's ``HTTPBearer`` reads it)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return missing()
        if self.is_local(token):
            return None
        try:
            self.verify(token)
        except HTTPException as exc:
            return exc
        return None

    def live(self, token_id: int | None) -> bool:
        """Whether the token of this id (None: the local one) is still neither revoked nor expired."""
        if token_id is None:
            return True
        record = self._by_id.get(token_id)
        return (record is not None and record.revoked_at is None
                and (record.expires_at is None or record.expires_at > self.clock()))

    def due_for_touch(self, record: TokenRecord, now: float) -> bool:
        return record.last_used_at is None or now - record.last_used_at >= TOUCH_EVERY_S

    def touch(self, record: TokenRecord, now: float) -> None:
        """Record that the token was used (called at most every ``TOUCH_EVERY_S``)."""
        record.last_used_at = now
        with self.sessions() as session:
            session.execute(update(ApiToken).where(ApiToken.id == record.id).values(last_used_at=now))
            session.commit()

    def create(self, user: str, role: str | None, expires_at: float | None, note: str | None,
               by: str, audit: Audit | None = None) -> tuple[TokenRecord, str]:
        """A new token for ``user``: its record and the token itself, which is never stored.
        ``audit`` writes its entry in the same transaction."""
        token = PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock, self.sessions() as session:
            row = ApiToken(digest=digest(token), user=user, role=role, note=note, created_by=by, created_at=now,
                           expires_at=expires_at)
            session.add(row)
            session.flush()
            record = TokenRecord.of(row)
            if audit is not None:
                audit(session, record)
            session.commit()
            self._by_digest[row.digest] = record
            self._by_id[record.id] = record
        return record, token

    def revoke(self, token_id: int, audit: Audit | None = None) -> tuple[TokenRecord, bool] | None:
        """Revoke a token: (its record, whether this call revoked it); None if no such token.
        ``audit`` writes the entry of a revocation in its transaction."""
        with self._lock:
            record = self._by_id.get(token_id)
            if record is None:
                return None
            if record.revoked_at is not None:
                return record, False
            now = self.clock()
            with self.sessions() as session:
                session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=now))
                if audit is not None:
                    audit(session, record)
                session.commit()
            record.revoked_at = now
            return record, True

    def records(self, include_revoked: bool = False) -> list[TokenRecord]:
        return sorted((r for r in self._by_id.values() if include_revoked or r.revoked_at is None),
                      key=lambda r: r.id)
