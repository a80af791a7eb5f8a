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


class Claim:
    """Held for a server's lifetime: two servers over one database would both run control
    loops over the same jobs and start them twice. On PostgreSQL a session advisory lock,
    released by the server's connection closing however the process ends; on SQLite an
    flock on a file beside the database (the database may live outside CORRAL_HOME, whose
    own lock only guards the home)."""

    def __init__(self, handle: Connection | IO[str] | None):
        self._handle = handle

    @classmethod
    def take(cls, url: str) -> Claim | None:
        """The claim, or None if another live server holds it."""
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                return cls(None)  # a private database: no other server can reach it
            lock = lock_file(f"{parsed.database}.server.lock")
            return cls(lock) if lock is not None else None
        conn = create_engine(url, poolclass=NullPool).connect()
        if not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": SERVER_LOCK_KEY}).scalar():
            conn.close()
            return None
        conn.commit()  # end the implicit transaction; the session-level lock stays
        return cls(conn)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()


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
