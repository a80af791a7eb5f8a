"""Multifactor priority, fair share and backfill in the pure scheduler: unit cases with
builders, and hypothesis properties (backfill never delays the reservation of the first
blocked job; never overcommit; gangs all-or-none; deterministic)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import CORRAL_BY_GPUS, node, task
from corral.scheduler import NodeView, PendingJob, Reason, Snapshot, priorities, schedule
from corral.scheduler.backfill import Book, Timeline, reserve
from corral.scheduler.core import Policy
from corral.scheduler.placement import FreePool, Scope, place_gang
from corral.scheduler import fairshare
from corral.scheduler.policy import Account, PriorityWeights
from corral.scheduler.priority import decay, factors
from corral.scheduler.snapshot import RunningJob

SLURM, CORRAL = Policy.named("slurm"), Policy.named("corral")


def pending(job_id: int, gpus: int, limit: float, submitted: float = 0.0, account: str = "a", replicas: int = 1,
            nice: int = 0) -> PendingJob:
    return PendingJob(job_id, (task("t", replicas, gpus=gpus),), submitted, account, account, limit, nice)


def world(nodes: list[NodeView], running: list[tuple[int, int, float]], jobs: list[PendingJob],
          usage: dict[tuple[str, str], float] | None = None) -> Snapshot:
    """``running``: (id, gpus on one node, expected end), placed on an idle pool first."""
    pool = FreePool(nodes)
    held = []
    for job_id, gpus, end in running:
        allocs = place_gang(pool, pending(job_id, gpus, 1))
        assert allocs is not None
        held.append(RunningJob(job_id, allocs, end))
    free = pool.views()
    return Snapshot(free, tuple(jobs), tuple(held), usage or {})


def test_backfill_starts_a_short_job_that_ends_before_the_reservation() -> None:
    # 8 GPUs, 6 busy until t=100; the 8-GPU job 1 must wait for them; job 3 (2 GPUs, 500 s)
    # would fit now but still run at t=100; job 2 (2 GPUs, 50 s) is done by then
    snap = world([node("n", gpus=8)], [(9, 6, 100.0)], [pending(1, 8, 1000, 0), pending(3, 2, 500, 1),
                                                        pending(2, 2, 50, 2)])
    plan = schedule(snap, 0.0, SLURM)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.reserved_starts[1] == 100.0
    assert plan.reasons[1] == Reason.RESOURCES and plan.reasons[3] == Reason.PRIORITY
    # a size factor by GPUs favouring small jobs: job 3 outranks the 8-GPU job and simply starts
    assert [s.job_id for s in schedule(snap, 0.0, CORRAL_BY_GPUS).starts] == [3]
    # corral's default sizes by GPUs x time limit, smallest first: job 2, then job 3, outrank
    # the 8-GPU job; job 2 starts, and job 3 then finds no room
    ranks = priorities(snap, 0.0, CORRAL)
    assert ranks[2].total > ranks[3].total > ranks[1].total
    plan = schedule(snap, 0.0, CORRAL)
    assert [s.job_id for s in plan.starts] == [2] and plan.reasons[3] == Reason.RESOURCES


def test_backfill_keeps_off_what_the_reservation_needs() -> None:
    # two nodes: n0 busy until 100 (the 8-GPU job waits for it); n1 free: long jobs may use it
    snap = world([node("n0", gpus=8), node("n1", gpus=8)], [(9, 8, 100.0)],
                 [pending(1, 8, 1000, 0), pending(2, 8, 5000, 1)])
    plan = schedule(snap, 0.0, CORRAL)
    # job 1 fits on n1 right away: nothing is blocked
    assert [s.job_id for s in plan.starts] == [1]
    snap = world([node("n0", gpus=8), node("n1", gpus=8)], [(9, 8, 100.0)],
                 [pending(1, 8, 1000, 0, replicas=2), pending(2, 8, 5000, 1), pending(3, 8, 50, 2)])
    plan = schedule(snap, 0.0, SLURM)
    assert [s.job_id for s in plan.starts] == [3]  # 50 s < 100 s: it is done before job 1 starts
    assert plan.reserved_starts[1] == 100.0 and plan.reasons[2] == Reason.PRIORITY  # would hold n1 past 100 s


def test_fifo_never_backfills() -> None:
    snap = world([node("n", gpus=8)], [(9, 6, 100.0)], [pending(1, 4, 1000, 0), pending(2, 2, 50, 1)])
    assert schedule(snap, 0.0, Policy.named("fifo")).starts == []


def test_fair_share_orders_an_underserved_account_first() -> None:
    flat = Policy()
    assert fairshare.factors(flat, {}, {("a", "a"), ("b", "b")})[("a", "a")] == 1.0
    # a used everything, half the machine is its share: UE = 1, S = 0.5 -> 2^-2
    used = fairshare.factors(flat, {("a", "a"): 100.0}, {("b", "b")})
    assert used[("a", "a")] == 0.25 and used[("b", "b")] == 1.0
    snap = world([node("n", gpus=1)], [], [pending(1, 1, 10, 0, account="heavy"), pending(2, 1, 10, 5, account="light")],
                 usage={("heavy", "heavy"): 1e6, ("light", "light"): 1.0})
    assert [s.job_id for s in schedule(snap, 10.0, SLURM).starts] == [2]


def test_priority_factors_age_size_and_nice() -> None:
    policy = Policy(weights=PriorityWeights(max_age_s=100))
    young, old = pending(1, 1, 10, submitted=90), pending(2, 1, 10, submitted=0)
    assert factors(old, 100, policy, 0.5, 8).age == 1.0 and factors(young, 100, policy, 0.5, 8).age == 0.1
    big = pending(3, 8, 10)
    assert factors(big, 0, policy, 0.5, 8).job_size == 1.0
    assert factors(big, 0, Policy(weights=PriorityWeights(favor_small=True)), 0.5, 8).job_size == 0.0
    nice = pending(4, 1, 10, nice=500)
    assert factors(nice, 0, policy, 0.5, 8).total == factors(pending(5, 1, 10), 0, policy, 0.5, 8).total - 500


def test_usage_decays_with_the_half_life() -> None:
    assert decay({"a": 8.0}, 20.0, 10.0) == {"a": 2.0}
    assert decay({"a": 8.0}, 0.0, 10.0) == {"a": 8.0}


@st.composite
def busy_world(draw):
    nodes = [node(f"n{i}", gpus=draw(st.sampled_from([4, 8]))) for i in range(draw(st.integers(1, 4)))]
    pool = FreePool(nodes)
    running = []
    for job_id in range(100, 100 + draw(st.integers(0, 6))):
        gpus = draw(st.integers(1, 8))
        allocs = place_gang(pool, pending(job_id, gpus, 1))  # leaves the pool as it was if it does not fit
        if allocs is not None:
            user = draw(st.sampled_from("abc"))  # c: a user with nothing pending
            running.append(RunningJob(job_id, allocs, float(draw(st.integers(1, 500))), user, user))
    jobs = [pending(i, draw(st.integers(1, 8)), float(draw(st.integers(1, 600))), float(i), draw(st.sampled_from("ab")),
                    replicas=draw(st.integers(1, 2))) for i in range(1, draw(st.integers(2, 12)))]
    return Snapshot(pool.views(), tuple(jobs), tuple(running), {("a", "a"): 50.0, ("b", "b"): 10.0})


@settings(max_examples=250, deadline=None)
@given(busy_world(), st.sampled_from(["slurm", "corral"]))
def test_backfill_never_delays_the_first_reservation(snap: Snapshot, name: str) -> None:
    policy = Policy.named(name)
    plan = schedule(snap, 0.0, policy)
    prio = priorities(snap, 0.0, policy)
    order = sorted(snap.pending, key=lambda j: (-prio[j.id].total, j.submitted_at, j.id))
    started = {s.job_id: s for s in plan.starts}
    blocked = next((j for j in order if plan.reasons.get(j.id) == Reason.RESOURCES and j.id in plan.reserved_starts),
                   None)
    if blocked is None:
        return
    ahead = [started[j.id] for j in order[:order.index(blocked)] if j.id in started]

    def earliest(starts) -> float:
        pool, timeline = FreePool(snap.nodes), Timeline()
        for r in snap.running:
            timeline.add(r.expected_end, r.allocations)
        limits = {j.id: j.time_limit for j in snap.pending}
        for s in starts:
            for a in s.allocations:
                pool.assume(a)
            timeline.add(limits[s.job_id], s.allocations)
        found = reserve(blocked, Book(pool), timeline, 0.0, Scope(first_fit=policy.packing == "first_fit"))
        return found.start if found else float("inf")

    assert earliest(plan.starts) <= earliest(ahead) + 1e-9
    # and the gangs are whole and never overcommit
    used: dict[str, set[int]] = defaultdict(set)
    for s in plan.starts:
        job = next(j for j in snap.pending if j.id == s.job_id)
        assert len(s.allocations) == sum(t.replicas for t in job.tasks)
        for a in s.allocations:
            assert set(a.gpus) <= set(next(n for n in snap.nodes if n.name == a.node).free_gpus)
            assert not used[a.node] & set(a.gpus)
            used[a.node] |= set(a.gpus)
    assert schedule(snap, 0.0, policy) == plan


@settings(max_examples=250, deadline=None)
@given(busy_world(), st.sampled_from(["slurm", "corral"]))
def test_backfill_delays_no_reservation_of_the_chain(snap: Snapshot, name: str) -> None:
    # Every reservation holds its GPUs only until its own expected end, so later gangs are
    # reserved after it on the same GPUs; replaying the chain after all of the plan's
    # starts (each earlier reservation booked where the plan put it: recomputed, a
    # first-fit tie between nodes freed at once could pick another) must give no
    # reservation a later start than the plan promised.
    policy = Policy.named(name)
    plan = schedule(snap, 0.0, policy)
    pool, timeline = FreePool(snap.nodes), Timeline()
    for r in snap.running:
        timeline.add(r.expected_end, r.allocations)
    jobs = {j.id: j for j in snap.pending}
    for s in plan.starts:
        for a in s.allocations:
            pool.assume(a)
        timeline.add(jobs[s.job_id].time_limit, s.allocations)
    book, scope = Book(pool), Scope(first_fit=policy.packing == "first_fit")
    for job_id, promised in plan.reserved_starts.items():
        found = reserve(jobs[job_id], book, timeline, 0.0, scope)
        assert found is not None and found.start <= promised + 1e-9
        book.add(replace(found, start=promised, allocations=plan.reserved_on[job_id],
                         end=promised + jobs[job_id].time_limit), timeline)


def test_reservations_hold_gpus_only_until_their_own_end() -> None:
    # one 8-GPU node, 4 GPUs busy until t=100: job 1 (8 GPUs, 50 s) is reserved at 100 and
    # holds the node until 150; job 2 (8 GPUs, 50 s) gets the node after it, at 150 (were
    # holds open-ended, job 2 would get no reservation at all and nothing to protect it)
    snap = world([node("n", gpus=8)], [(9, 4, 100.0)],
                 [pending(1, 8, 50, 0), pending(2, 8, 50, 1), pending(3, 4, 120, 2), pending(4, 4, 90, 3)])
    plan = schedule(snap, 0.0, SLURM)
    assert plan.reserved_starts == {1: 100.0, 2: 150.0}
    assert [s.job_id for s in plan.starts] == [4]  # done by 90; job 3 would still run at 100
    assert plan.reasons[3] == Reason.PRIORITY


def test_slurm_model_packs_first_fit_in_node_order_corral_best_fit() -> None:
    # n0 idle, n1 with 2 GPUs free, n2 idle: Slurm's cons_tres takes the first node that
    # fits (n0); corral's best fit takes the fullest that fits (n1), keeping n0 whole
    snap = world([node("n0", gpus=8), node("n1", gpus=8), node("n2", gpus=8)], [],
                 [pending(1, 1, 100, 0)])
    snap = Snapshot(tuple(n if n.name != "n1" else NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, n.labels,
                                                             frozenset({6, 7}), n.free_cpus, n.free_memory)
                          for n in snap.nodes), snap.pending)
    assert [a.node for a in schedule(snap, 0.0, SLURM).starts[0].allocations] == ["n0"]
    assert [a.node for a in schedule(snap, 0.0, CORRAL).starts[0].allocations] == ["n1"]


def test_a_gang_whose_replicas_share_one_node_gets_its_reservation() -> None:
    # two 4-GPU replicas fit on the one 8-GPU node once it is free at t=10 (a pre-check that
    # counted nodes, not replica slots, once gave such gangs no reservation at all)
    snap = world([node("n", gpus=8)], [(9, 8, 10.0)], [pending(1, 4, 5, 0, replicas=2), pending(2, 1, 100, 1)])
    plan = schedule(snap, 0.0, SLURM)
    assert plan.reserved_starts == {1: 10.0, 2: 15.0}  # job 2 after job 1's hold ends


def test_job_size_by_gpu_time_ranks_the_declared_area_on_a_log_scale() -> None:
    """``size_by: gpu_time``: size is GPUs x time limit, log(1 + GPU-minutes) over the
    cluster's GPU-minutes in ``size_span_s``; favor_small then puts a 1-GPU, 10-minute job
    ahead of a 1-GPU, 2-day job, which the GPU count alone cannot tell apart."""
    by_time = Policy(weights=PriorityWeights(favor_small=True, size_by="gpu_time", size_span_s=30 * 86400.0))
    short, long_ = pending(1, 1, 600), pending(2, 1, 2 * 86400)
    wide = pending(3, 8, 600)
    s, lg, w = (factors(j, 0, by_time, 0.5, 8).job_size for j in (short, long_, wide))
    assert s > w > lg
    assert abs(s - (1 - math.log1p(10) / math.log1p(8 * 30 * 1440))) < 1e-12
    whole = pending(4, 8, 30 * 86400)  # the whole cluster for the whole span: the largest size
    assert factors(whole, 0, by_time, 0.5, 8).job_size == 0.0
    unlimited = PendingJob(5, (task("main", gpus=8),), 0.0, "a", "a", None)  # no limit counts as the span
    assert factors(unlimited, 0, by_time, 0.5, 8).job_size == 0.0
    by_gpus = Policy(weights=PriorityWeights(favor_small=True))
    assert factors(short, 0, by_gpus, 0.5, 8).job_size == factors(long_, 0, by_gpus, 0.5, 8).job_size


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.floats(60, 30 * 86400), st.integers(1, 64), st.floats(1, 30 * 86400),
       st.floats(0, 3 * 86400 - 1))
def test_under_corral_a_job_at_max_age_outranks_every_younger_one(old_gpus: int, old_limit: float, gpus: int,
                                                                  limit: float, young_age: float) -> None:
    """A size factor (favouring small, by GPUs or by GPUs x time limit) that fades with age
    and weighs no more than age: however long or wide a job is, once it has waited max_age
    (3 days) no younger job of the same fair share, however small, ranks above it. (corral's
    default weighs size above age; its bound is the starve limit, tested below.)"""
    now = 3 * 86400.0
    old = pending(1, old_gpus, old_limit, submitted=0.0)
    young = pending(2, gpus, limit, submitted=now - young_age)
    by_time = Policy.named("corral", weights=replace(CORRAL.weights, job_size=5000.0))
    cubic = Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, age_power=3.0))
    for policy in (CORRAL_BY_GPUS, by_time, cubic):
        assert factors(old, now, policy, 0.3, 512).total > factors(young, now, policy, 0.3, 512).total


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0, 10.0), st.integers(1, 64), st.floats(60, 30 * 86400), st.floats(0, 4 * 86400),
       st.floats(0, 4 * 86400), st.sampled_from(["gpus", "gpu_time"]),
       st.sampled_from([1000.0, 5000.0, 10000.0, 20000.0]))
def test_a_waiting_job_never_loses_priority_whatever_the_weights(power: float, gpus: int, limit: float, waited: float,
                                                                 more: float, size_by: str, job_size: float) -> None:
    """The size factor fades by the same powered age factor, and by at most what the age
    weight brings in, so age gained always outweighs size lost: a job never sinks in the
    queue by waiting, and no younger twin overtakes it. (A linear fade under a cubic age, or
    a full fade of a size weight above the age weight, would: among equals the newest would
    go first.)"""
    policy = Policy.named("corral", weights=replace(CORRAL.weights, age_power=power, size_by=size_by,
                                                    job_size=job_size))
    job = pending(1, gpus, limit, submitted=0.0)
    earlier, later = factors(job, waited, policy, 0.3, 512), factors(job, waited + more, policy, 0.3, 512)
    assert later.total >= earlier.total - 1e-9
    assert earlier.age == pytest.approx(min(1.0, waited / (3 * 86400)) ** power)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 16), st.floats(60, 30 * 86400), st.floats(0, 4 * 86400), st.floats(0, 4 * 86400))
def test_under_corral_an_older_twin_is_never_passed_by_a_younger_one(gpus: int, limit: float, older: float,
                                                                      younger: float) -> None:
    """corral weighs size (10000) above age (5000): a full fade would let a small job lose
    size faster than it gains age, and a twin submitted later would pass it; the floor
    keeps the older one at least level (exactly: a rounding error once ordered twins
    newest-first), so twins go in submit order."""
    older, younger = max(older, younger), min(older, younger)
    now = 4 * 86400.0
    # room for one of them now: the older starts
    running = [(9, 16 - gpus, now + 100)] if gpus < 16 else []
    snap = world([node("n", gpus=16)], running, [pending(1, gpus, limit, now - older),
                                                 pending(2, gpus, limit, now - younger)])
    ranks = priorities(snap, now, CORRAL)
    assert ranks[1].total >= ranks[2].total
    assert [s.job_id for s in schedule(snap, now, CORRAL).starts] == [1]


def test_a_starving_job_queues_ahead_of_higher_priority_ones_and_holds_its_reservation() -> None:
    # 16 GPUs, 12 busy until t=8200. Job 1 (14 GPUs) has waited 2 h, from a heavy account;
    # job 2 (4 GPUs, 5000 s) is new, from an idle account, so it outranks job 1 and would
    # start now on the free 4, pushing job 1 back to t=12140.
    now = 7200.0
    snap = world([node("n", gpus=16)], [(9, 12, now + 1000)],
                 [pending(1, 14, 3600, 0.0, account="heavy"), pending(2, 4, 5000, now - 60, account="idle")],
                 usage={("heavy", "heavy"): 1e7})
    ranks = priorities(snap, now, CORRAL_BY_GPUS)
    assert ranks[2].total > ranks[1].total
    assert [s.job_id for s in schedule(snap, now, CORRAL_BY_GPUS).starts] == [2]
    # starve_after 1 h: job 1, 14 of the 16 GPUs, starves after 1 h x 2/16 = 450 s, goes
    # first, reserves t=8200, and job 2 may not delay it
    starving = Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, starve_after_s=3600.0))
    ranks = priorities(snap, now, starving)
    assert ranks[1].starve_s == 450.0 and ranks[2].starve_s == 2700.0
    plan = schedule(snap, now, starving)
    assert plan.starts == [] and plan.reserved_starts[1] == now + 1000
    assert plan.reasons[2] == Reason.PRIORITY
    # not yet starving after 300 s: priority decides as before
    plan = schedule(snap, 300.0, starving)
    assert [s.job_id for s in plan.starts] == [2]


def test_starving_jobs_queue_oldest_first_whatever_their_priority() -> None:
    # one free GPU; three 1-GPU jobs that all waited past the starve limit: the oldest
    # starts although the idle account's younger job has far higher fair share
    starving = Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, starve_after_s=3600.0))
    jobs = [pending(1, 1, 600, 100.0, account="idle"), pending(2, 1, 600, 0.0, account="heavy"),
            pending(3, 1, 600, 50.0, account="heavy")]
    snap = world([node("n", gpus=2)], [(9, 1, 9000.0)], jobs, usage={("heavy", "heavy"): 1e7})
    assert [s.job_id for s in schedule(snap, 5000.0, starving).starts] == [2]
    assert [s.job_id for s in schedule(snap, 5000.0, CORRAL_BY_GPUS).starts] == [1]


def test_larger_jobs_starve_sooner_and_no_limit_means_never() -> None:
    policy = Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, starve_after_s=86400.0))
    small, large, whole = pending(1, 1, 600), pending(2, 32, 600), pending(3, 64, 600)
    got = {j.id: factors(j, 0.0, policy, 0.5, 64).starve_s for j in (small, large, whole)}
    assert got == {1: 86400.0 * 63 / 64, 2: 43200.0, 3: 0.0}
    by_time = Policy.named("corral", weights=replace(policy.weights, size_by="gpu_time"))
    assert factors(pending(4, 1, 60), 0.0, by_time, 0.5, 64).starve_s > \
        factors(pending(5, 1, 86400), 0.0, by_time, 0.5, 64).starve_s
    assert factors(whole, 0.0, CORRAL_BY_GPUS, 0.5, 64).starve_s == math.inf  # off: never, even at full size
    assert not factors(whole, 0.0, CORRAL_BY_GPUS, 0.5, 64).starving(1e12)


def test_only_users_short_of_their_share_of_the_gpus_may_starve() -> None:
    # 16 GPUs, 4 free. heavy's 4-GPU job has waited 2 h (past the 1 h limit scaled to
    # 45 min); light's is new, and outranks it on fair share. Two users with work: 8 GPUs each.
    now, policy = 7200.0, Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, starve_after_s=3600.0))
    jobs = [pending(1, 4, 600, 0.0, account="heavy"), pending(2, 4, 600, now - 60, account="light")]
    usage = {("heavy", "heavy"): 1e7}

    def snap(heavy_holds: int) -> Snapshot:
        held = world([node("n", gpus=16)], [(9, heavy_holds, now + 1000), (8, 12 - heavy_holds, now + 1000)], jobs,
                     usage)
        owner = {9: "heavy", 8: "idle"}
        running = tuple(replace(r, user=owner[r.id], account=owner[r.id]) for r in held.running)
        return replace(held, running=running)

    assert priorities(snap(12), now, policy)[2].total > priorities(snap(12), now, policy)[1].total
    # heavy holds all 12 busy GPUs, more than its 16/3 (idle counts while it runs): priority decides
    plan = schedule(snap(12), now, policy)
    assert plan.hungry == {("light", "light")} and [s.job_id for s in plan.starts] == [2]
    # heavy holds 4, under its 16/3: its starving job goes first
    plan = schedule(snap(4), now, policy)
    assert ("heavy", "heavy") in plan.hungry and [s.job_id for s in plan.starts] == [1]
    # no starve limit, no lane: nobody is hungry
    assert schedule(snap(4), now, CORRAL_BY_GPUS).hungry == frozenset()


def test_entitlements_split_the_cluster_by_shares_among_those_with_work() -> None:
    policy = Policy.named("corral", accounts=(Account("ml", shares=3, users=("ann", "bo")), Account("hep", shares=1),
                                             Account("bio", shares=4)))
    # bio has no work: its shares lend to the others; ml's 3/4 split between its two users
    got = fairshare.entitlements(policy, {("ml", "ann"), ("ml", "bo"), ("hep", "cy")})
    assert got == {("ml", "ann"): pytest.approx(3 / 8), ("ml", "bo"): pytest.approx(3 / 8),
                   ("hep", "cy"): pytest.approx(1 / 4)}
    assert fairshare.entitlements(policy, {("ml", "ann")}) == {("ml", "ann"): 1.0}


@settings(max_examples=200, deadline=None)
@given(busy_world(), st.floats(0.0, 24.0))
def test_the_oldest_starving_job_is_first_in_line(snap: Snapshot, starve: float) -> None:
    """With a starve limit, the oldest starving job (of a user short of their share) that
    does not start is reserved exactly where it would be were only the older starving jobs
    ahead of it: nothing of higher priority, and nothing backfilled, pushes it back."""
    now = 13.0  # jobs were submitted at t = 1, 2, ...
    policy = Policy.named("corral", weights=replace(CORRAL.weights, starve_after_s=starve))
    plan = schedule(snap, now, policy)
    started = {s.job_id: s for s in plan.starts}
    ranks = priorities(snap, now, policy)
    starving = sorted((j for j in snap.pending
                       if j.assoc in plan.hungry and ranks[j.id].starving(now - j.submitted_at)),
                      key=lambda j: (j.submitted_at, j.id))
    first = next((j for j in starving if j.id not in started), None)
    if first is None:
        return
    pool, timeline = FreePool(snap.nodes), Timeline()
    for r in snap.running:
        timeline.add(r.expected_end, r.allocations)
    for j in starving[:starving.index(first)]:
        for a in started[j.id].allocations:
            pool.assume(a)
        timeline.add(now + j.time_limit, started[j.id].allocations)
    found = reserve(first, Book(pool), timeline, now, Scope())
    if found is None:  # larger than the cluster
        assert first.id not in plan.reserved_starts
    else:
        assert plan.reserved_starts[first.id] == found.start


def test_a_running_job_on_a_node_that_left_the_pool_breaks_no_cycle() -> None:
    # a replica still recorded on a node the configuration no longer has (the server restarted
    # with that node removed): its release is nothing the pool gets back, for backfill and
    # for preemption's what-if alike; before, both raised KeyError on every cycle
    from corral.scheduler import Allocation

    gone = RunningJob(9, (Allocation("t", 0, "gone", (0, 1), 1.0, 1.0),), 100.0, "a", "a")
    snap = world([node("n", gpus=4)], [(8, 4, 50.0)], [pending(1, 4, 1000, 0), pending(2, 4, 10, 1)])
    snap = replace(snap, running=snap.running + (gone,))
    for policy in (SLURM, CORRAL):
        plan = schedule(snap, 0.0, policy)
        assert not plan.starts  # "gone"'s GPUs never count as coming back to "n"
        assert min(plan.reserved_starts[j] for j in (1, 2)) == 50.0  # when job 8 gives "n" back
