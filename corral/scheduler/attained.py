"""Least attained service within a tier (``Policy.las``, after Tiresias' discretised 2D-LAS):
which running jobs a pending job may stop for being shorter work, and in what order.

Slurm only lets a higher tier (partition tier, QOS ``preempt``) stop work; a long job that
checkpoints otherwise holds its GPUs to the end while short jobs of its own tier queue behind
it. Here a job's *attained service* is the GPU-seconds it has held over all its attempts; its
queue is how many of the policy's thresholds that crossed (0: the top). A pending job may stop
a running job of the same partition tier in a lower queue, if that job declared it
checkpoints (``preemptible``) and is requeued, not cancelled, when stopped. The victim keeps
its work up to its last checkpoint and pays its restart cost; the guards bound that cost:

- a victim has run at least max(min_run_s, min_run_factor x restart cost) since it last
  started (no thrashing: each restart buys at least K times its cost in progress);
- a job is stopped this way at most ``max_preempted`` times, then runs to its end;
- a pending job that has waited over ``promote_after`` x its attained run time is back in the
  top queue (no starvation of a long job by a stream of short ones);
- the tier order stays: a higher tier is never a victim of a lower one, nor a job whose QOS
  may preempt the pending job's.

Pure, like the rest of the scheduler: the victims go into the plan's ``Preemption`` and the
applier carries them out (requeue with grace), in the control loop and the simulator alike.

``Victims`` bounds the work per cycle (a long backlog made every blocked job walk every
running job through the policy: a 4,500-job week of philly-pollux ran over 14 minutes): the
guards that do not depend on the pending job are applied once per cycle, and a blocked job
whose queue no running job is below, or whose gang the victims it could have cannot make
room for, does not search at all."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from corral.scheduler.policy import Las, Policy
from corral.scheduler.snapshot import PendingJob, RunningJob


def level(gpu_s: float, las: Las) -> int:
    """The queue of ``gpu_s`` attained GPU-seconds: 0 below the first threshold."""
    return bisect_right(las.thresholds_gpu_s, gpu_s)


def attained(job: RunningJob, now: float) -> float:
    """GPU-seconds ``job`` has held so far, this attempt included."""
    return job.attained_gpu_s + job.gpus * max(0.0, now - job.started_at)


def pending_level(job: PendingJob, now: float, las: Las) -> int:
    """The queue of a pending job; the top one once it waited ``promote_after`` x its
    attained run time (its wait since it was submitted, less the time it ran)."""
    if job.attained_gpu_s <= 0.0:
        return 0
    ran = job.attained_gpu_s / max(1, job.gpus)
    if now - job.submitted_at - ran >= las.promote_after * ran:
        return 0
    return level(job.attained_gpu_s, las)


def order_queue(ready: list[PendingJob], now: float, policy: Policy) -> None:
    """Within each partition tier, jobs of a higher queue go first (the order stays as it
    was within a queue, so starving jobs stay first in theirs): a job stopped for shorter
    work does not start again before the job it was stopped for, until its wait promotes it.
    (Putting starving jobs first whatever their queue was measured and not kept: las's mean
    wait on alibaba:h2, seeds 0-2, was 8,535 / 2,259 / 2,036 s with it, 2,011 / 2,268 / 2,206
    without. The starve bound holds without it: a job's queue is the top one again once it
    waited ``promote_after`` x its attained run time.)"""
    las = policy.las
    tiers = {p.name: p.priority_tier for p in policy.partitions}
    default = policy.default_partition.priority_tier
    ready.sort(key=lambda j: (-tiers.get(j.partition, default), pending_level(j, now, las)))


def min_run(job: RunningJob, las: Las) -> float:
    """How long ``job`` must have run since its last start before it may be stopped."""
    return max(las.min_run_s, las.min_run_factor * job.restart_cost_s)


def victim(job: PendingJob, r: RunningJob, policy: Policy, now: float) -> bool:
    """Whether ``job`` may stop running ``r`` as shorter work of the same tier."""
    las = policy.las
    if las is None or not r.preemptible or r.no_requeue or job.owner:
        return False
    if policy.partition(job.partition).priority_tier != policy.partition(r.partition).priority_tier:
        return False  # across tiers, only Slurm's order decides
    if policy.preempts(r.partition, r.qos, job.partition, job.qos):
        return False  # its QOS outranks the pending job's
    if policy.preempt_mode(r.partition, r.qos) != "requeue" or r.preempted >= las.max_preempted:
        return False
    if now - r.started_at < min_run(r, las):
        return False
    return level(attained(r, now), las) > pending_level(job, now, las)


class Victims:
    """The running jobs some pending job could stop as shorter work this cycle (the guards of
    ``victim`` that do not depend on the pending job), by partition tier and queue, built once
    per cycle: ``of`` is ``victim`` over them, ``could`` a bound that is cheap to ask."""

    def __init__(self, running: Iterable[RunningJob], policy: Policy, now: float) -> None:
        las = policy.las
        assert las is not None
        self.policy, self.now = policy, now
        # tier -> [(queue, job)], the lowest queue (the most attained) first
        self.by_tier: dict[int, list[tuple[int, RunningJob]]] = {}
        self.gpus: dict[int, dict[int, int]] = {}  # tier -> queue -> GPUs of unclaimed victims
        self.where: dict[int, tuple[int, int, int]] = {}  # job id -> (tier, queue, GPUs)
        for r in running:
            if r.ending or not r.preemptible or r.no_requeue or r.preempted >= las.max_preempted:
                continue
            if policy.preempt_mode(r.partition, r.qos) != "requeue" or now - r.started_at < min_run(r, las):
                continue
            tier, queue = policy.partition(r.partition).priority_tier, level(attained(r, now), las)
            self.by_tier.setdefault(tier, []).append((queue, r))
            by_queue = self.gpus.setdefault(tier, {})
            by_queue[queue] = by_queue.get(queue, 0) + r.gpus
            self.where[r.id] = (tier, queue, r.gpus)
        # whether Slurm's order (tiers, QOS preempt lists) may also stop work: else shorter
        # work is the only reason any job is stopped
        self.tiered = len({p.priority_tier for p in policy.partitions}) > 1 or any(q.preempt for q in policy.qos)
        for jobs in self.by_tier.values():
            jobs.sort(key=lambda e: -e[0])

    def claim(self, ids: Iterable[int]) -> None:
        """``ids`` are being stopped for a job this cycle: no other job counts on them."""
        for i in ids:
            if i in self.where:
                tier, queue, gpus = self.where.pop(i)
                self.gpus[tier][queue] -= gpus

    def could(self, job: PendingJob) -> int:
        """GPUs of the unclaimed running jobs ``job`` might stop (an upper bound: a victim's
        QOS may still outrank it); 0 when it can stop none."""
        las = self.policy.las
        if job.owner:
            return 0
        mine = pending_level(job, self.now, las)
        by_queue = self.gpus.get(self.policy.partition(job.partition).priority_tier, {})
        return sum(g for q, g in by_queue.items() if q > mine)

    def of(self, job: PendingJob, claimed: set[int]) -> list[RunningJob]:
        """The running jobs ``job`` may stop as shorter work, not in ``claimed``: exactly
        those ``victim`` accepts."""
        if job.owner:
            return []
        policy = self.policy
        mine = pending_level(job, self.now, policy.las)
        out = []
        for queue, r in self.by_tier.get(policy.partition(job.partition).priority_tier, ()):
            if queue <= mine:
                break  # the rest are in queues no lower than the job's
            if r.id not in claimed and not policy.preempts(r.partition, r.qos, job.partition, job.qos):
                out.append(r)
        return out


def shorter_work(job: PendingJob, r: RunningJob, policy: Policy) -> bool:
    """Whether ``job`` would stop ``r`` as shorter work, not by Slurm's tier order."""
    return policy.las is not None and not policy.preempts(job.partition, job.qos, r.partition, r.qos)


def order(job: PendingJob, r: RunningJob, policy: Policy, now: float) -> tuple:
    """Victims' order: jobs of a lower tier first (Slurm's preemption, unchanged), then
    same-tier jobs from the lowest queue up, the most attained service first."""
    las = policy.las
    if las is None or not shorter_work(job, r, policy):
        return (0, 0, 0.0)
    served = attained(r, now)
    return (1, -level(served, las), -served)


def why(job: PendingJob, r: RunningJob, now: float) -> str:
    """What the stopped job's events say."""
    waited = max(0.0, now - job.submitted_at)
    served = attained(r, now)
    amount = f"{served / 3600:.1f} GPU-h" if served >= 360 else f"{served / 60:.0f} GPU-min"
    return (f"preempted for shorter work: attained {amount}, "
            f"job {job.id} waited {_span(waited)}")


def _span(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
