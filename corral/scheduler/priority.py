"""Slurm's multifactor priority, as a pure function of a pending job, the time and the
fair-share factors of the cycle: a weighted sum of factors in [0, 1] minus the job's nice.

  age        — waited time / max_age, capped at 1 (PriorityMaxAge), to the power age_power
               (1, Slurm's, unless a site sets it: see PriorityWeights)
  fair-share — from ``fairshare`` (the account tree, decayed usage)
  job size   — GPUs asked / GPUs in the cluster (favor_small flips it, PriorityFavorSmall);
               or, with size_by="gpu_time", log(1 + GPUs x time limit in minutes) over the
               cluster's GPU-minutes in size_span_s (a CPU-only job counts as one GPU);
               with ``size_fades`` (corral's) it is scaled by (1 - age), but never below what
               keeps age + size at its value when the job was new, see PriorityWeights
  partition  — the partition's job factor / the largest one (PriorityJobFactor)
  qos        — the QOS priority / the largest one
  expansion  — waited / min(time limit, cap), capped at 1 (Maui's XFACTOR; a job without a
               time limit counts as the cap; weight 0 unless a site sets it), see PriorityWeights

An operator-set ``priority`` replaces the sum (like ``scontrol update priority=``).
Usage decays with a half-life (PriorityDecayHalfLife) in ``decay``."""

from __future__ import annotations

import math
from typing import NamedTuple

from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import PendingJob


# How often corral's control loop rescores every pending job (Slurm's PriorityCalcPeriod is
# 5 min): new jobs arrive and usage moves in seconds on a small cluster, and the expansion
# factor, where a site weighs it, moves in seconds for short jobs.
CALC_PERIOD_S = 5.0

# Below a minute, the expansion factor would mostly measure how often the loop runs (Maui's
# XFMINWCLIMIT plays the same part).
_MIN_LIMIT_S = 60.0


class Factors(NamedTuple):
    age: float
    fair_share: float
    job_size: float
    partition: float
    qos: float
    expansion: float
    nice: int
    total: float
    starve_s: float = math.inf  # the wait after which it is starving (PriorityWeights.starve_after_s)

    def starving(self, waited: float) -> bool:
        return waited >= self.starve_s


class Scorer:
    """Computes factors for many jobs of one cycle, with the weights, the per-partition and
    per-QOS parts looked up once (every pending job is rescored every few seconds, so this
    is the scheduler's hottest loop on a long queue)."""

    def __init__(self, policy: Policy, now: float, cluster_gpus: int):
        self.policy, self.now = policy, now
        self._part: dict[str, float] = {}
        self._qos: dict[str, float] = {}
        w = policy.weights
        self._w = (w.age, w.fair_share, w.job_size, w.partition, w.qos, w.expansion)
        self._per_gpu = 1.0 / cluster_gpus if cluster_gpus else 0.0
        self._by_time = w.size_by == "gpu_time"
        self._starves = w.starve_after_s != math.inf  # (inf x 0 would be nan)
        # log(1 + GPU-minutes) over log(1 + the cluster's GPU-minutes in size_span_s)
        self._log_span = 1.0 / math.log1p(cluster_gpus * w.size_span_s / 60.0) if cluster_gpus else 0.0
        # the weights' knobs, read once per cycle rather than once per job
        self._knobs = (w.max_age_s, w.size_span_s, w.starve_after_s, w.favor_small, w.age_power, w.size_fades)

    def factors(self, job: PendingJob, fair_share: float) -> Factors:
        w_age, w_fs, w_size, w_part, w_qos, w_exp = self._w
        max_age_s, size_span_s, starve_after_s, favor_small, age_power, size_fades = self._knobs
        waited = self.now - job.submitted_at
        if waited < 0.0:
            waited = 0.0
        age = waited / max_age_s
        if age > 1.0:
            age = 1.0
        if self._by_time:
            limit = job.run_s if job.run_s is not None else size_span_s
            size = math.log1p(max(job.gpus, 1) * limit / 60.0) * self._log_span
        else:
            size = job.gpus * self._per_gpu
        if size > 1.0:
            size = 1.0
        starve_s = starve_after_s * (1.0 - size) if self._starves else math.inf
        if favor_small:
            size = 1.0 - size
        if age_power != 1.0:
            age **= age_power
        lift = None  # age and size together, when the fade's floor sets them
        if size_fades:
            faded = size * (1.0 - age)
            # never below the priority it had when new: what size loses, age must bring in
            if w_size * (size - faded) > w_age * age:
                # exactly a new twin's sum, so twins tie (and go in submit order) rather than
                # differ by a rounding error
                lift = w_size * size
                faded = size - w_age * age / w_size
            size = faded
        policy = self.policy
        part = self._part.get(job.partition)
        if part is None:
            part = self._part[job.partition] = policy.partition(job.partition).job_factor / policy.max_job_factor
        qos = self._qos.get(job.qos)
        if qos is None:
            top = policy.max_qos_priority
            qos = self._qos[job.qos] = policy.qos_of(job.qos).priority / top if top > 0 else 0.0
        expansion = 0.0
        if w_exp:
            cap = policy.weights.expansion_cap_s
            limit = job.time_limit or cap
            if limit > cap:
                limit = cap
            expansion = waited / (limit if limit > _MIN_LIMIT_S else _MIN_LIMIT_S)
            if expansion > 1.0:
                expansion = 1.0
        if job.priority is not None:
            total = job.priority
        else:
            if lift is None:
                lift = w_age * age + w_size * size
            total = lift + w_fs * fair_share + w_part * part + w_qos * qos + w_exp * expansion - job.nice
        return Factors(age, fair_share, size, part, qos, expansion, job.nice, total, starve_s)


def factors(job: PendingJob, now: float, policy: Policy, fair_share: float, cluster_gpus: int) -> Factors:
    return Scorer(policy, now, cluster_gpus).factors(job, fair_share)


def decay(usage: dict, elapsed_s: float, half_life_s: float) -> dict:
    if elapsed_s <= 0 or not usage:
        return dict(usage)
    keep = math.pow(0.5, elapsed_s / half_life_s)
    return {k: v * keep for k, v in usage.items() if v * keep > 1e-9}
