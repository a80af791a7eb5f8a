"""``schedule(snapshot, now, policy) -> Plan``: the pure scheduling function. No store, no
clock, no randomness: the same snapshot always gives the same plan.

The cycle, in numbered steps:
  1. heads   — pending jobs in the policy's order (FIFO: submit order);
  2. pool    — a what-if copy of free resources from the snapshot;
  3. admit   — place each job's whole gang or nothing;
  4. block   — under strict FIFO the first job that cannot start holds back all behind it
               (reason ``Priority`` for them, its own reason for it)."""

from __future__ import annotations

from dataclasses import dataclass

from corral.scheduler.placement import FreePool, GpuTypeFilter, FreeNode, place_gang
from corral.scheduler.plan import Plan, Reason, Start
from corral.scheduler.snapshot import PendingJob, Snapshot


@dataclass(frozen=True)
class Policy:
    name: str = "fifo"
    max_starts_per_cycle: int = 10_000


def schedule(snapshot: Snapshot, now: float, policy: Policy = Policy()) -> Plan:
    del now  # FIFO ignores time; kept so richer policies drop in behind the same boundary
    plan = Plan()
    pool = FreePool(snapshot.nodes)
    blocked = False
    for job in snapshot.pending:
        if blocked or len(plan.starts) >= policy.max_starts_per_cycle:
            plan.reasons[job.id] = Reason.PRIORITY
            continue
        allocations = place_gang(pool, job)
        if allocations is None:
            plan.reasons[job.id] = _reason(snapshot, job)
            blocked = True
            continue
        plan.starts.append(Start(job.id, allocations))
    return plan


def _reason(snapshot: Snapshot, job: PendingJob) -> Reason:
    for task in job.tasks:
        if not any(GpuTypeFilter().feasible(FreeNode(n, set(), 0, 0), task) for n in snapshot.nodes):
            return Reason.GPU_TYPE
    return Reason.RESOURCES
