"""The usage ledger: what every (account, user, QOS) has consumed, for fair share and for
GPU-minute budgets. The control loop accrues running replicas' resources each cycle
(GPU-seconds plus the site's weights for CPU- and GB-seconds, Slurm's TRES billing),
decays the fair-share charge with the half-life, and persists the ledger every few
seconds and at shutdown, so a restart keeps fair share (losing at most those seconds)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from corral.store.tables import Usage

Key = tuple[str, str, str]  # (account, user, qos)


@dataclass(frozen=True)
class Holding:
    """One running replica's resources, charged to its job's association."""

    account: str
    user: str
    qos: str
    gpus: int
    cpus: float
    memory: float


class Ledger:
    def __init__(self, half_life_s: float, gpu: float = 1.0, cpu: float = 0.0, memory: float = 0.0,
                 flush_every_s: float = 5.0):
        self.half_life_s = half_life_s
        self.weights = (gpu, cpu, memory)
        self.flush_every_s = flush_every_s
        self.charge: dict[Key, float] = defaultdict(float)
        self.gpu_seconds: dict[Key, float] = defaultdict(float)
        self.as_of: float | None = None
        self._stored: set[Key] = set()
        self._flushed_at = -math.inf

    def load(self, session: Session, now: float) -> None:
        for row in session.scalars(select(Usage)):
            key = (row.account, row.user, row.qos)
            self.charge[key] = row.charge * self._keep(now - row.updated_at)
            self.gpu_seconds[key] = row.gpu_seconds
            self._stored.add(key)
        self.as_of = now

    def _keep(self, elapsed: float) -> float:
        return math.pow(0.5, max(0.0, elapsed) / self.half_life_s) if self.half_life_s > 0 else 1.0

    def accrue(self, now: float, holdings: Iterable[Holding]) -> None:
        """Charge ``holdings`` for the time since the last accrual, then decay everything."""
        if self.as_of is None:
            self.as_of = now
            return
        elapsed = now - self.as_of
        if elapsed <= 0:
            return
        keep = self._keep(elapsed)
        for key in self.charge:
            self.charge[key] *= keep
        gpu_w, cpu_w, mem_w = self.weights
        for h in holdings:
            key = (h.account, h.user, h.qos)
            # charged at the midpoint's decay: exact for a constant holding over the interval
            self.charge[key] += (gpu_w * h.gpus + cpu_w * h.cpus + mem_w * h.memory) * elapsed * math.sqrt(keep)
            self.gpu_seconds[key] += h.gpus * elapsed
        self.as_of = now

    def usage(self) -> dict[tuple[str, str], float]:
        """Decayed charge per (account, user), what fair share reads."""
        out: dict[tuple[str, str], float] = defaultdict(float)
        for (account, user, _), value in self.charge.items():
            out[(account, user)] += value
        return dict(out)

    def gpu_minutes(self) -> dict[str, float]:
        """Spent GPU-minutes (never decayed) per ``account:NAME`` (its own jobs; the limits
        add sub-accounts) and per ``qos:NAME``."""
        out: dict[str, float] = defaultdict(float)
        for (account, _, qos), seconds in self.gpu_seconds.items():
            out[f"account:{account}"] += seconds / 60.0
            out[f"qos:{qos}"] += seconds / 60.0
        return dict(out)

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
