"""The usage ledger: what every (account, user, QOS) has consumed, for fair share and for
GPU-minute budgets. Pure (no store, no clock of its own), so the control loop and the
simulator charge usage by one rule: running replicas' resources accrue each step
(GPU-seconds plus the site's weights for CPU- and GB-seconds, Slurm's TRES billing) and
the fair-share charge decays with the half-life. ``control.accounting`` persists it."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

Key = tuple[str, str, str]  # (account, user, qos)


@dataclass(frozen=True)
class Holding:
    """One running replica's (or job's) resources, charged to its job's association."""

    account: str
    user: str
    qos: str
    gpus: int
    cpus: float
    memory: float


class UsageLedger:
    def __init__(self, half_life_s: float, gpu: float = 1.0, cpu: float = 0.0, memory: float = 0.0):
        self.half_life_s = half_life_s
        self.weights = (gpu, cpu, memory)
        self.charge: dict[Key, float] = defaultdict(float)
        self.gpu_seconds: dict[Key, float] = defaultdict(float)
        self.as_of: float | None = None

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
