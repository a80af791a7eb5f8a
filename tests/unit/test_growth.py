"""Elastic tasks growing on their own into idle GPUs (corral.scheduler.growth): only what no
pending job can use, never over the maximum or a limit, never delaying a reservation, lent
replicas taken back first by anyone, and the one applier re-checking every growth."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import (Growable, NodeView, Partition, PendingJob, Policy, Qos, Reason, RunningJob, Shrinkable,
                              Snapshot, TaskRequest, schedule)
from corral.scheduler.applier import apply_plan
from corral.scheduler.growth import SETTLE_S, WANTS_RESOURCES
from corral.scheduler.placement import FreePool, place_gang
from corral.scheduler.plan import Grow

CORRAL = Policy.named("corral")
FIFO = Policy.named("fifo")
NOW = 100.0


def nodes(n: int = 2, gpus: int = 8) -> list[NodeView]:
    return [NodeView(f"n-{i}", gpus, 64, 512) for i in range(n)]


def pj(job_id: int, gpus: int = 1, replicas: int = 1, limit: float | None = 3600.0, user: str = "ann",
       qos: str = "", partition: str = "", submitted: float = 0.0) -> PendingJob:
    return PendingJob(job_id, (TaskRequest("t", replicas, gpus, 0.1, 0.0),), submitted, user, "", limit,
                      partition=partition, qos=qos)


def elastic(pool: FreePool, job_id: int, replicas: int, *, low: int = 1, high: int = 8, initial: int | None = None,
            gpus: int = 1, end: float = 10_000.0, settled_at: float = 0.0, grow: bool = True, user: str = "bob",
            qos: str = "", partition: str = "", cpus: float = 0.1) -> RunningJob:
    """A running elastic task of ``replicas`` one-replica allocations placed in ``pool``."""
    request = TaskRequest("w", 1, gpus, cpus, 0.0)
    allocs = []
    for rank in range(replicas):
        (alloc,) = place_gang(pool, PendingJob(job_id, (request,)))
        allocs.append(replace(alloc, rank=rank))
    allocs = tuple(allocs)
    initial = replicas if initial is None else initial
    shrink = (Shrinkable("w", low, allocs, lent_above=initial if grow else None),) if replicas > low else ()
    growable = (Growable("w", replicas, high, request, settled_at),) if grow else ()
    return RunningJob(job_id, allocs, end, user, "", partition, qos, 0.0, elastic=shrink, growable=growable)


def world(*running_specs, n: int = 2, gpus: int = 8):
    pool = FreePool(nodes(n, gpus))
    running = tuple(elastic(pool, *args, **kw) for args, kw in running_specs)
    return pool, running


def plan_of(pool: FreePool, running, pending=(), policy: Policy = CORRAL, now: float = NOW):
    return schedule(Snapshot(pool.views(), tuple(pending), tuple(running)), now, policy)


def test_a_growing_task_fills_idle_gpus_up_to_its_maximum_with_the_next_ranks() -> None:
    pool, running = world(((10, 2), {"high": 12}))
    plan = plan_of(pool, running)
    (grow,) = plan.grows
    assert (grow.job_id, grow.task, grow.replicas) == (10, "w", 12)
    assert sorted(a.rank for a in grow.allocations) == list(range(2, 12))
    assert len({(a.node, g) for a in grow.allocations for g in a.gpus}) == 10


def test_it_stops_at_the_gpus_there_are() -> None:
    pool, running = world(((10, 2), {"high": 64}))
    (grow,) = plan_of(pool, running).grows
    assert grow.replicas == 16


def test_a_task_that_did_not_ask_never_grows() -> None:
    pool, running = world(((10, 2), {"grow": False}))
    assert plan_of(pool, running).grows == []


def test_a_site_may_turn_growth_off() -> None:
    pool, running = world(((10, 2), {}))
    assert plan_of(pool, running, policy=replace(CORRAL, grow=False)).grows == []


def test_a_task_shrunk_for_someone_else_waits_its_settle_time() -> None:
    pool, running = world(((10, 2), {"settled_at": NOW + SETTLE_S}))
    assert plan_of(pool, running).grows == []
    assert plan_of(pool, running, now=NOW + SETTLE_S).grows != []


def test_pending_jobs_go_first_and_growth_takes_only_the_rest() -> None:
    pool, running = world(((10, 2), {}))
    plan = plan_of(pool, running, [pj(1, gpus=4), pj(2, gpus=8)])
    assert sorted(s.job_id for s in plan.starts) == [1, 2]
    (grow,) = plan.grows
    assert grow.replicas == 2 + 2  # 16 - 2 running - 12 started


def test_no_growth_while_a_job_waits_for_resources_without_a_reservation() -> None:
    """Strict FIFO reserves nothing: its blocked head must find the idle GPUs still idle."""
    pool, running = world(((10, 2), {}))
    plan = plan_of(pool, running, [pj(1, gpus=8, replicas=2)], policy=FIFO)
    assert plan.reasons[1] == Reason.RESOURCES and plan.grows == []


def test_growth_never_delays_a_reservation() -> None:
    """A 12-GPU job waits for a job ending at 1000; the growing task runs to 10,000, so it may
    not take the idle GPUs the reservation needs at 1000 (only what it leaves over)."""
    pool = FreePool(nodes(2))
    blocker = PendingJob(5, (TaskRequest("b", 1, 4, 0.1, 0.0),))
    (alloc,) = place_gang(pool, blocker)
    short = RunningJob(5, (alloc,), 1000.0, "cat", "", "", "", 0.0)
    grower = elastic(pool, 10, 2, high=16)
    big = pj(1, gpus=6, replicas=2, submitted=0.0)
    plan = plan_of(pool, (short, grower), [big])
    assert plan.reserved_starts[1] == 1000.0
    # 10 GPUs idle now, 12 of the 14 free at 1000 are the reservation's: growth gets at most 2
    # (where best fit puts a replica now is all it tries, as for a backfilled job)
    assert sum(len(g.allocations) for g in plan.grows) <= 2
    without = plan_of(pool, (short, replace(grower, growable=())), [big])
    assert without.reserved_starts == plan.reserved_starts


def test_growth_that_ends_before_a_reservation_may_backfill() -> None:
    pool = FreePool(nodes(2))
    blocker = PendingJob(5, (TaskRequest("b", 1, 4, 0.1, 0.0),))
    (alloc,) = place_gang(pool, blocker)
    short = RunningJob(5, (alloc,), 1000.0, "cat", "", "", "", 0.0)
    grower = elastic(pool, 10, 2, high=16, end=900.0)  # its limit comes before the reservation
    plan = plan_of(pool, (short, grower), [pj(1, gpus=6, replicas=2)])
    assert plan.reserved_starts[1] == 1000.0
    assert [g.replicas for g in plan.grows] == [12]


def test_qos_limits_hold_for_growth() -> None:
    policy = Policy.named("corral", qos=(Qos("normal", max_gpus_per_user=5),))
    pool, running = world(((10, 2), {"qos": "normal"}))
    (grow,) = plan_of(pool, running, policy=policy).grows
    assert grow.replicas == 5


def test_growth_stays_in_the_partition() -> None:
    policy = Policy.named("corral", partitions=(Partition("a", nodes=("n-0",)), Partition("b", nodes=("n-1",))))
    pool, running = world(((10, 2), {"partition": "a"}))
    (grow,) = plan_of(pool, running, policy=policy).grows
    assert grow.replicas == 8 and {a.node for a in grow.allocations} == {"n-0"}


def test_two_growing_tasks_take_turns() -> None:
    pool, running = world(((10, 1), {"high": 16}), ((11, 1), {"high": 16}), n=1)
    grows = {g.job_id: g.replicas for g in plan_of(pool, running).grows}
    assert grows == {10: 4, 11: 4}


def test_lent_replicas_are_taken_back_by_a_job_of_the_same_tier_highest_first() -> None:
    """No tiers, no QOS preempt lists: preemption could never stop anything, yet what growth
    lent goes back to the pending job; what the task started with does not."""
    pool, running = world(((10, 16), {"initial": 2, "high": 16}))
    plan = plan_of(pool, running, [pj(1, gpus=4)])
    (found,) = plan.preemptions
    assert found.for_job == 1 and found.victims == ()
    assert [(s.job_id, s.replicas) for s in found.shrinks] == [(10, 12)]
    assert plan.reasons[1] == Reason.PREEMPTING
    applied = apply_plan(FreePool(pool.views()), plan, running, CORRAL)
    (down,) = applied.downsizes
    assert sorted(a.rank for a in down.stopped) == [12, 13, 14, 15]
    # more than was lent: it waits; the initial replicas are not taken
    plan = plan_of(pool, running, [pj(2, gpus=8, replicas=2)])
    assert plan.preemptions == [] and plan.grows == []


def test_what_a_task_without_gpus_was_lent_is_taken_back_too() -> None:
    """A CPU-only task grows into idle CPUs: a pending job that needs those CPUs (and no GPU)
    takes them back as a GPU job takes back lent GPUs, not wait for the task to end."""
    pool, running = world(((10, 8), {"initial": 1, "high": 8, "gpus": 0, "cpus": 16.0}))  # 2 x 64 CPUs: all taken
    plan = plan_of(pool, running, [PendingJob(1, (TaskRequest("t", 1, 0, 32.0, 0.0),), 0.0, "ann", "", 3600.0)])
    (found,) = plan.preemptions
    assert found.for_job == 1 and found.victims == ()
    assert [(s.job_id, s.replicas) for s in found.shrinks] == [(10, 6)]
    assert plan.reasons[1] == Reason.PREEMPTING


def test_a_growth_request_never_takes_lent_replicas() -> None:
    pool, running = world(((10, 16), {"initial": 2, "high": 16}))
    request = replace(pj(-99, gpus=1), owner=7)
    plan = plan_of(pool, running, [request])
    assert plan.preemptions == []


def test_the_applier_rechecks_growth() -> None:
    pool, running = world(((10, 2), {"high": 4}))
    job = running[0]
    fresh = FreePool(pool.views())
    (alloc,) = place_gang(fresh.copy(), PendingJob(10, (TaskRequest("w", 1, 1, 0.1, 0.0),)))
    ok = Grow(10, "w", 3, (replace(alloc, rank=2),))
    over = Grow(10, "w", 5, (replace(alloc, rank=2), replace(alloc, rank=3, gpus=(7,))))
    applied = apply_plan(FreePool(pool.views()), replace(plan_of(pool, (), []), grows=[ok]), running, CORRAL)
    assert applied.grown == [ok]
    applied = apply_plan(FreePool(pool.views()), replace(plan_of(pool, (), []), grows=[over]), running, CORRAL)
    assert applied.grown == [] and "size the plan" not in applied.refused[0].why
    ending = replace(job, ending=True)
    applied = apply_plan(FreePool(pool.views()), replace(plan_of(pool, (), []), grows=[ok]), (ending,), CORRAL)
    assert applied.refused[0].why == "already being stopped"
    taken = FreePool(pool.views())
    taken.take(replace(alloc, rank=0))
    applied = apply_plan(taken, replace(plan_of(pool, (), []), grows=[ok]), running, CORRAL)
    assert applied.refused[0].why == "its resources are no longer free"


# -- property: growth takes nothing anyone else is owed -------------------------------------

@st.composite
def worlds(draw):
    n = draw(st.integers(1, 3))
    gpus = draw(st.sampled_from([4, 8]))
    pool = FreePool(nodes(n, gpus))
    running = []
    for job_id in range(10, 10 + draw(st.integers(0, 3))):
        per = draw(st.sampled_from([1, 2]))
        count = draw(st.integers(1, 3))
        if pool.free_gpus < per * count:
            break
        low = draw(st.integers(1, count))
        high = draw(st.integers(count, 12))
        initial = draw(st.integers(low, count))  # below count: some of it was lent
        end = draw(st.sampled_from([500.0, 2000.0, 50_000.0]))
        try:
            job = elastic(pool, job_id, count, low=low, high=high, initial=initial, gpus=per, end=end,
                          grow=draw(st.booleans()), user=f"u{job_id}")
        except (TypeError, ValueError):  # did not fit
            break
        running.append(job)
    pending = [pj(job_id, gpus=draw(st.sampled_from([1, 2, 4, gpus])), replicas=draw(st.integers(1, 2)),
                  limit=draw(st.sampled_from([300.0, 3000.0])), user=f"p{job_id % 2}", submitted=float(job_id))
               for job_id in range(1, 1 + draw(st.integers(0, 4)))]
    policy = draw(st.sampled_from([CORRAL, FIFO, Policy.named("slurm")]))
    return pool, tuple(running), pending, policy


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_growth_never_overcommits_nor_exceeds_max_nor_takes_what_a_pending_job_is_owed(w) -> None:
    pool, running, pending, policy = w
    plan = plan_of(pool, running, pending, policy)
    baseline = plan_of(pool, running, pending, replace(policy, grow=False))
    # what pending jobs get is exactly what they get without growth: same starts, same
    # reservations at the same times, same preemptions, same reasons
    assert plan.starts == baseline.starts
    assert plan.reserved_starts == baseline.reserved_starts
    assert plan.preemptions == baseline.preemptions
    assert plan.reasons == baseline.reasons
    if plan.grows:
        started = plan.started_ids()
        assert not any(j.id not in started and j.id not in plan.reserved_starts
                       and plan.reasons.get(j.id) in WANTS_RESOURCES for j in pending)
        # no pending job waiting for resources fits in what was free before growth took it
    by_id = {r.id: r for r in running}
    used = {(a.node, g) for r in running for a in r.allocations for g in a.gpus}
    for start in plan.starts:
        for a in start.allocations:
            for g in a.gpus:
                assert (a.node, g) not in used
                used.add((a.node, g))
    for grow in plan.grows:
        part = next(p for p in by_id[grow.job_id].growable if p.task == grow.task)
        assert grow.replicas <= part.max_replicas
        assert sorted(a.rank for a in grow.allocations) == list(range(part.replicas, grow.replicas))
        for a in grow.allocations:
            for g in a.gpus:
                assert (a.node, g) not in used, "growth overcommitted a GPU"
                used.add((a.node, g))
    applied = apply_plan(FreePool(pool.views()), plan, running, policy)
    assert applied.grown == plan.grows  # the applier agrees with a fresh plan
    for preemption in plan.preemptions:  # a job that may not preempt takes back only what was lent
        for shrink in preemption.shrinks:
            part = next(p for p in by_id[shrink.job_id].elastic if p.task == shrink.task)
            assert shrink.replicas >= max(part.min_replicas, part.lent_above or 0) or policy.preempting
