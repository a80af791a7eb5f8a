"""The one plan applier (control loop and simulator): a gang is taken all or none, a start
that no longer fits leaves nothing held, and every preemption, shrink and dependency cancel
is re-checked against the running jobs as they are now."""

from __future__ import annotations

from corral.scheduler import Allocation, NodeView, Partition, Policy, Preemption, Qos, RunningJob, Shrink, Shrinkable
from corral.scheduler.applier import Downsize, Eviction, apply_plan, apply_starts
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


# -- apply_plan: preemptions, shrinks and dependency cancels, each re-checked -------------

TIERS = Policy.named("slurm", partitions=(Partition("low"), Partition("high", priority_tier=10),
                                          Partition("pinned", preempt_mode="off")),
                     qos=(Qos("normal"), Qos("scavenger", preempt_mode="cancel")))


def _on(node: str, *gpus: int, rank: int = 0) -> Allocation:
    return Allocation("main", rank, node, gpus, 0.0, 0.0)


def _elastic(job_id: int, replicas: int, low: int) -> RunningJob:
    allocs = tuple(_on("a", r, rank=r) for r in range(replicas))
    return RunningJob(job_id, allocs, 1e9, partition="low", elastic=(Shrinkable("main", low, allocs),))


def test_victims_are_evicted_in_their_mode_and_stale_ones_refused() -> None:
    running = [RunningJob(1, (_on("a", 0),), 1e9, partition="low"),
               RunningJob(2, (_on("a", 1),), 1e9, partition="low", qos="scavenger"),
               RunningJob(3, (_on("a", 2),), 1e9, partition="low", no_requeue=True),
               RunningJob(4, (_on("a", 3),), 1e9, partition="low", ending=True),
               RunningJob(5, (_on("b", 0),), 1e9, partition="pinned")]
    plan = Plan(preemptions=[Preemption(10, (1, 2, 3, 4, 5, 6)), Preemption(11, (1,))])
    pool = FreePool([NodeView("a", 4, 4, 8, free_gpus=frozenset()), NodeView("b", 2, 4, 8)])
    before = _free(pool)
    applied = apply_plan(pool, plan, running, TIERS)
    assert applied.evictions == [Eviction(1, "requeue", 10), Eviction(2, "cancel", 10), Eviction(3, "cancel", 10)]
    assert [(r.job_id, r.kind) for r in applied.refused] == [(4, "evict"), (5, "evict"), (6, "evict"), (1, "evict")]
    assert "already being stopped" in applied.refused[0].why and "off" in applied.refused[1].why
    assert "no longer running" in applied.refused[2].why
    assert _free(pool) == before  # an eviction frees nothing now: the caller releases after the grace period


def test_a_shrink_stops_the_highest_ranks_and_never_goes_below_the_minimum() -> None:
    running = [_elastic(1, 6, 2), _elastic(2, 4, 3), RunningJob(3, (_on("b", 0),), 1e9, partition="low")]
    plan = Plan(preemptions=[Preemption(10, (), (Shrink(1, "main", 4), Shrink(2, "main", 2), Shrink(3, "main", 0))),
                             Preemption(11, (), (Shrink(1, "main", 4), Shrink(1, "main", 3)))])
    applied = apply_plan(FreePool([NodeView("a", 8, 4, 8), NodeView("b", 1, 4, 8)]), plan, running, TIERS)
    # job 1: 6 -> 4 (ranks 4, 5 stop), then the second plan's 4 is no shrink at all, then 4 -> 3 (rank 3)
    assert applied.downsizes == [Downsize(1, "main", 4, 10, (_on("a", 4, rank=4), _on("a", 5, rank=5))),
                                 Downsize(1, "main", 3, 11, (_on("a", 3, rank=3),))]
    refused = {(r.job_id, r.why) for r in applied.refused}
    assert (2, "2 replicas is below task 'main''s elastic minimum 3") in refused
    assert (3, "task 'main' is not shrinkable now") in refused
    assert (1, "task 'main' already has 4 replicas, not more than 4") in refused


def test_an_evicted_job_is_not_also_shrunk() -> None:
    plan = Plan(preemptions=[Preemption(10, (1,), (Shrink(1, "main", 2),))])
    applied = apply_plan(FreePool([NodeView("a", 8, 4, 8)]), plan, [_elastic(1, 4, 1)], TIERS)
    assert applied.evictions == [Eviction(1, "requeue", 10)] and applied.downsizes == []
    assert applied.refused[0].why == "already being stopped"


def test_a_growth_request_never_preempts_or_shrinks() -> None:
    plan = Plan(preemptions=[Preemption(-7, (1,), (Shrink(2, "main", 1),))])
    applied = apply_plan(FreePool([NodeView("a", 8, 4, 8)]), plan,
                         [RunningJob(1, (_on("a", 0),), 1e9, partition="low"), _elastic(2, 3, 1)], TIERS)
    assert applied.evictions == [] and applied.downsizes == []
    assert {(r.job_id, r.kind, r.why) for r in applied.refused} == {(1, "evict", "a growth request never preempts"),
                                                                   (2, "shrink", "a growth request never preempts")}


def test_dependency_cancels_only_for_jobs_still_pending_and_starts_as_apply_starts() -> None:
    pool = FreePool([NodeView("a", 2, 4, 8)])
    plan = Plan(starts=[Start(5, (_on("a", 0),)), Start(6, (_on("a", 0),))], cancels={7: "never", 8: "never"})
    applied = apply_plan(pool, plan, [], TIERS, pending={5, 6, 7})
    assert [s.job_id for s in applied.accepted] == [5] and [s.job_id for s in applied.stale] == [6]
    assert [(c.job_id, c.why) for c in applied.cancels] == [(7, "never")]
    assert [(r.job_id, r.kind) for r in applied.refused] == [(8, "cancel")]
    assert _free(pool) == {"a": (1,)}
