"""The one plan applier (control loop and simulator): a gang is taken all or none, and a
start that no longer fits leaves nothing held."""

from __future__ import annotations

from corral.scheduler import Allocation, NodeView
from corral.scheduler.applier import apply_starts
from corral.scheduler.placement import FreePool
from corral.scheduler.plan import Plan, Start


def _free(pool: FreePool) -> dict[str, tuple[int, ...]]:
    return {v.name: tuple(sorted(v.free_gpus)) for v in pool.views()}


def test_a_stale_gang_leaves_nothing_held_and_later_starts_still_apply() -> None:
    pool = FreePool([NodeView("a", 2, 4, 8), NodeView("b", 2, 4, 8)])
    pool.assume(Allocation("x", 0, "b", (1,), 0.0, 0.0))  # taken since the snapshot
    plan = Plan()
    gang = Start(1, (Allocation("t", 0, "a", (0, 1), 1.0, 0.0), Allocation("t", 1, "b", (0, 1), 1.0, 0.0)))
    later = Start(2, (Allocation("u", 0, "a", (0,), 1.0, 0.0),))
    gone = Start(3, (Allocation("v", 0, "c", (0,), 1.0, 0.0),))  # its node left the pool
    plan.starts.extend([gang, later, gone])
    accepted, stale = apply_starts(pool, plan)
    assert accepted == [later] and stale == [gang, gone]
    assert _free(pool) == {"a": (1,), "b": (0,)}  # only job 2's GPU and the outside one are held
