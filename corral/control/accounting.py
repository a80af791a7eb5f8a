"""The stored usage ledger: the pure ``scheduler.usage.UsageLedger`` (the one the simulator
charges too) persisted to the store every few seconds and at shutdown, so a restart keeps
fair share (losing at most those seconds)."""

from __future__ import annotations

import math

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from corral.scheduler.usage import Holding, UsageLedger
from corral.store.tables import Usage

__all__ = ["Holding", "Ledger"]


class Ledger(UsageLedger):
    def __init__(self, half_life_s: float, gpu: float = 1.0, cpu: float = 0.0, memory: float = 0.0,
                 flush_every_s: float = 5.0):
        super().__init__(half_life_s, gpu, cpu, memory)
        self.flush_every_s = flush_every_s
        self._stored: set[tuple[str, str, str]] = set()
        self._flushed_at = -math.inf

    def load(self, session: Session, now: float) -> None:
        for row in session.scalars(select(Usage)):
            key = (row.account, row.user, row.qos)
            self.charge[key] = row.charge * self._keep(now - row.updated_at)
            self.gpu_seconds[key] = row.gpu_seconds
            self._stored.add(key)
        self.as_of = now

    def flush(self, session: Session, now: float, force: bool = False) -> None:
        if not force and now - self._flushed_at < self.flush_every_s:
            return
        self._flushed_at = now
        table = Usage.__table__
        for key in set(self.charge) | set(self.gpu_seconds):
            values = {"charge": self.charge.get(key, 0.0), "gpu_seconds": self.gpu_seconds.get(key, 0.0),
                      "updated_at": self.as_of if self.as_of is not None else now}
            if key in self._stored:
                session.execute(update(table).where(table.c.account == key[0], table.c.user == key[1],
                                                    table.c.qos == key[2]).values(**values))
            else:
                session.execute(table.insert().values(account=key[0], user=key[1], qos=key[2], **values))
                self._stored.add(key)
