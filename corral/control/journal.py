"""Batched writes of one control-loop phase: row updates by primary key and event rows,
flushed as a handful of executemany statements instead of one round trip per change."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import bindparam, insert, update
from sqlalchemy.orm import Session

from corral.store.tables import Event, Job, Replica, Task


class Journal:
    _statements: dict[tuple[type, frozenset[str]], Any] = {}  # built once per table and column set

    def __init__(self) -> None:
        self._rows: dict[type, dict[int, dict[str, Any]]] = {Job: {}, Task: {}, Replica: {}}
        self._events: list[dict[str, Any]] = []
        # jobs whose row or story changed since the last ``take_touched``: the loop publishes
        # them with its view, so the API's long polls re-read only those
        self.touched: set[int] = set()

    def take_touched(self) -> frozenset[int]:
        touched, self.touched = frozenset(self.touched), set()
        return touched

    def job(self, job_id: int, **values: Any) -> None:
        self._rows[Job].setdefault(job_id, {}).update(values)
        self.touched.add(job_id)

    def task(self, task_id: int, **values: Any) -> None:
        self._rows[Task].setdefault(task_id, {}).update(values)

    def replica(self, replica_id: int, **values: Any) -> None:
        self._rows[Replica].setdefault(replica_id, {}).update(values)

    def event(self, job_id: int, ts: float, subject: str, cause: str, from_state: str | None = None,
              to_state: str | None = None, message: str | None = None) -> None:
        self._events.append({"job_id": job_id, "ts": ts, "subject": subject, "cause": cause,
                             "from_state": from_state, "to_state": to_state, "message": message})
        self.touched.add(job_id)

    def clear(self) -> None:
        """Drop what was journalled and not flushed (the cycle that wrote it failed)."""
        for rows in self._rows.values():
            rows.clear()
        self._events = []

    def __bool__(self) -> bool:
        return bool(self._events) or any(self._rows.values())

    def flush(self, session: Session) -> None:
        for table, rows in self._rows.items():
            by_keys: dict[frozenset[str], list[dict[str, Any]]] = defaultdict(list)
            for row_id, values in rows.items():
                by_keys[frozenset(values)].append({"id": row_id, **values})
            for keys, batch in by_keys.items():
                session.connection().execute(self._update(table, keys),
                                             [{"row_id": row.pop("id"), **row} for row in batch])
            rows.clear()
        if self._events:
            session.connection().execute(insert(Event.__table__), self._events)
            self._events = []

    @classmethod
    def _update(cls, table: type, keys: frozenset[str]) -> Any:
        """A Core executemany UPDATE by primary key (no ORM bookkeeping on the hot path)."""
        stmt = cls._statements.get((table, keys))
        if stmt is None:
            core = table.__table__  # type: ignore[attr-defined]
            stmt = update(core).where(core.c.id == bindparam("row_id")).values({k: bindparam(k) for k in keys})
            cls._statements[(table, keys)] = stmt
        return stmt
