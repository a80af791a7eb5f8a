"""The one plan applier, shared by the control loop and the simulator: it re-checks every
start of a plan against the free resources as they are now, and takes a gang all or none.
A start that no longer fits (resources taken since the snapshot, a node gone) is returned
as stale, with nothing of it held, for the next cycle to retry."""

from __future__ import annotations

from corral.scheduler.placement import FreePool
from corral.scheduler.plan import Plan, Start


def apply_starts(pool: FreePool, plan: Plan) -> tuple[list[Start], list[Start]]:
    """Assume every accepted start's allocations in ``pool``; returns (accepted, stale)."""
    accepted: list[Start] = []
    stale: list[Start] = []
    for start in plan.starts:
        taken = []
        try:
            for alloc in start.allocations:
                pool.assume(alloc)
                taken.append(alloc)
        except (ValueError, KeyError):  # no longer fits, or its node left the pool
            for alloc in taken:
                pool.release(alloc)
            stale.append(start)
            continue
        accepted.append(start)
    return accepted, stale
