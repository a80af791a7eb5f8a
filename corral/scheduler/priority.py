"""Slurm's multifactor priority, as a pure function of a pending job, the time and the
accounts' decayed usage: a weighted sum of factors in [0, 1] minus the job's nice value.

  age        — waited time / max_age, capped at 1 (PriorityMaxAge)
  fair-share — 2^(-U/S): U the account's share of decayed usage, S its normalised share
               (the classic Slurm formula; an account using exactly its share gets 0.5)
  job size   — GPUs asked / GPUs in the cluster (favor_small flips it, PriorityFavorSmall)

Usage decays with a half-life (PriorityDecayHalfLife) in ``decay``; the simulator and the
control loop keep it and hand it in through the snapshot."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.scheduler.snapshot import PendingJob, Snapshot


@dataclass(frozen=True)
class PriorityWeights:
    age: float = 1000.0
    fair_share: float = 10000.0
    job_size: float = 1000.0
    max_age_s: float = 7 * 86400.0
    favor_small: bool = False


@dataclass(frozen=True)
class Factors:
    age: float
    fair_share: float
    job_size: float
    nice: int
    total: float


def fair_share_factor(usage: dict[str, float], shares: dict[str, float], account: str) -> float:
    total = sum(usage.values())
    share = shares.get(account) or (1.0 / max(1, len(shares)) if shares else 1.0)
    used = usage.get(account, 0.0) / total if total > 0 else 0.0
    return 2.0 ** (-used / share) if share > 0 else 0.0


def factors(job: PendingJob, snapshot: Snapshot, now: float, weights: PriorityWeights, cluster_gpus: int) -> Factors:
    age = min(1.0, max(0.0, now - job.submitted_at) / weights.max_age_s)
    fair = fair_share_factor(snapshot.usage, snapshot.shares, job.account or job.user)
    size = min(1.0, job.gpus / cluster_gpus) if cluster_gpus else 0.0
    if weights.favor_small:
        size = 1.0 - size
    total = weights.age * age + weights.fair_share * fair + weights.job_size * size - job.nice
    return Factors(age, fair, size, job.nice, total)


def decay(usage: dict[str, float], elapsed_s: float, half_life_s: float) -> dict[str, float]:
    if elapsed_s <= 0 or not usage:
        return dict(usage)
    keep = math.pow(0.5, elapsed_s / half_life_s)
    return {k: v * keep for k, v in usage.items() if v * keep > 1e-9}
