"""Slurm's multifactor priority, as a pure function of a pending job, the time and the
fair-share factors of the cycle: a weighted sum of factors in [0, 1] minus the job's nice.

  age        — waited time / max_age, capped at 1 (PriorityMaxAge)
  fair-share — from ``fairshare`` (the account tree, decayed usage)
  job size   — GPUs asked / GPUs in the cluster (favor_small flips it, PriorityFavorSmall);
               with ``size_fades`` (corral's) it is scaled by (1 - age), see PriorityWeights
  partition  — the partition's job factor / the largest one (PriorityJobFactor)
  qos        — the QOS priority / the largest one

An operator-set ``priority`` replaces the sum (like ``scontrol update priority=``).
Usage decays with a half-life (PriorityDecayHalfLife) in ``decay``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import PendingJob


@dataclass(frozen=True)
class Factors:
    age: float
    fair_share: float
    job_size: float
    partition: float
    qos: float
    nice: int
    total: float


class Scorer:
    """Computes factors for many jobs of one cycle, with the per-partition and per-QOS
    parts looked up once."""

    def __init__(self, policy: Policy, now: float, cluster_gpus: int):
        self.policy, self.now, self.cluster_gpus = policy, now, cluster_gpus
        self._part: dict[str, float] = {}
        self._qos: dict[str, float] = {}

    def factors(self, job: PendingJob, fair_share: float) -> Factors:
        policy, w = self.policy, self.policy.weights
        age = min(1.0, max(0.0, self.now - job.submitted_at) / w.max_age_s)
        gpus = job.gpus
        size = min(1.0, gpus / self.cluster_gpus) if self.cluster_gpus else 0.0
        if w.favor_small:
            size = 1.0 - size
        if w.size_fades:
            size *= 1.0 - age
        part = self._part.get(job.partition)
        if part is None:
            part = self._part[job.partition] = policy.partition(job.partition).job_factor / policy.max_job_factor
        qos = self._qos.get(job.qos)
        if qos is None:
            top = policy.max_qos_priority
            qos = self._qos[job.qos] = policy.qos_of(job.qos).priority / top if top > 0 else 0.0
        total = (w.age * age + w.fair_share * fair_share + w.job_size * size + w.partition * part + w.qos * qos
                 - job.nice)
        if job.priority is not None:
            total = job.priority
        return Factors(age, fair_share, size, part, qos, job.nice, total)


def factors(job: PendingJob, now: float, policy: Policy, fair_share: float, cluster_gpus: int) -> Factors:
    return Scorer(policy, now, cluster_gpus).factors(job, fair_share)


def decay(usage: dict, elapsed_s: float, half_life_s: float) -> dict:
    if elapsed_s <= 0 or not usage:
        return dict(usage)
    keep = math.pow(0.5, elapsed_s / half_life_s)
    return {k: v * keep for k, v in usage.items() if v * keep > 1e-9}
