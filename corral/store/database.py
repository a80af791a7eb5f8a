"""Engine and sessions for SQLite (WAL, the embedded default) or PostgreSQL (a shared team
server), schema upgrades through Alembic at start-up, and the claim that makes a server the
only one running a control loop over a database."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001 - DB-API types
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


# pg_try_advisory_lock key of "the server of this database" (the bytes of "corral")
SERVER_LOCK_KEY = 0x636F7272616C


class ClaimLost(RuntimeError):
    """This server no longer owns the database's control loop: another server took it."""


class Claim:
    """Held for a server's lifetime: two servers over one database would both run control
    loops over the same jobs and start them twice. On PostgreSQL a session advisory lock,
    released by the server's connection closing however the process ends, plus an epoch
    (``server_claim``) each server raises when it takes the claim: every write of the
    control loop checks, in its own transaction, that the epoch is still its own (``fence``),
    so a server whose lock went away with its connection never writes beside the next one.
    On SQLite an flock on a file beside the database (the database may live outside
    CORRAL_HOME, whose own lock only guards the home); a file lock cannot be lost."""

    def __init__(self, handle: Connection | IO[str] | None, url: str | None = None):
        self._handle = handle
        self._url = url  # PostgreSQL: where to take the lock again when its connection is lost
        self.epoch: int | None = None

    @classmethod
    def take(cls, url: str) -> Claim | None:
        """The claim, or None if another live server holds it."""
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                return cls(None)  # a private database: no other server can reach it
            lock = lock_file(f"{parsed.database}.server.lock")
            return cls(lock) if lock is not None else None
        conn = _locked(url)
        return cls(conn, url) if conn is not None else None

    def begin(self, engine: Engine, holder: str, now: float) -> None:
        """Raise the epoch (after the schema is migrated): writes of any server that held the
        claim before are refused from now on."""
        if self._url is None:
            return
        with engine.begin() as conn:
            epoch = conn.execute(text("UPDATE server_claim SET epoch = epoch + 1, holder = :holder, taken_at = :now "
                                      "WHERE id = 1 RETURNING epoch"), {"holder": holder, "now": now}).scalar()
            if epoch is None:
                epoch = 1
                conn.execute(text("INSERT INTO server_claim (id, epoch, holder, taken_at) VALUES (1, 1, :holder, :now)"),
                             {"holder": holder, "now": now})
        self.epoch = int(epoch)

    def fence(self, session: Session) -> None:
        """Raise ``ClaimLost`` unless this server still owns the database; checked inside the
        writer's transaction (the row stays locked for share until it commits, so a server
        taking the claim waits for it, then every later check here fails)."""
        if self.epoch is None:
            return
        epoch = session.connection().execute(text("SELECT epoch FROM server_claim WHERE id = 1 FOR SHARE")).scalar()
        if epoch != self.epoch:
            raise ClaimLost(f"another server took this database over (claim epoch {epoch}, this server's {self.epoch})")

    def check(self) -> bool:
        """Whether the lock is still held: its connection answers, or, if it was cut, the lock
        could be taken again with the epoch still this server's. False: lost for good."""
        if self._url is None:
            return True
        try:
            self._handle.execute(text("SELECT 1")).scalar()  # type: ignore[union-attr]
            self._handle.rollback()  # type: ignore[union-attr]
            return True
        except Exception:
            pass
        try:
            self._handle.close()  # type: ignore[union-attr]
        except Exception:
            pass
        conn = _locked(self._url)
        if conn is None:
            return False
        epoch = conn.execute(text("SELECT epoch FROM server_claim WHERE id = 1")).scalar()
        conn.commit()
        if epoch != self.epoch:
            conn.close()
            return False
        self._handle = conn
        return True

    def release(self) -> None:
        if self._handle is not None:
            try:
                self._handle.close()
            except Exception:
                pass


def _locked(url: str) -> Connection | None:
    """A connection holding the server's advisory lock, or None if another session holds it."""
    conn = create_engine(url, poolclass=NullPool).connect()
    if not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": SERVER_LOCK_KEY}).scalar():
        conn.close()
        return None
    conn.commit()  # end the implicit transaction; the session-level lock stays
    return conn


def lock_file(path: Path | str) -> IO[str] | None:
    """An open file holding an exclusive flock on ``path`` (freed when the process ends
    however it ends), or None if another process holds it."""
    lock = open(path, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
