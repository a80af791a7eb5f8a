"""Site policy in the pure scheduler: partitions, tiers, QOS and account limits, GPU-minute
budgets, dependencies, topology, preemption with elastic shrink, the account tree's fair
share — unit cases with builders, and hypothesis properties (limits hold, no preemption
cycles, the same snapshot gives the same plan)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import CORRAL_BY_GPUS, node, task
from corral.scheduler import (Account, Dependency, NodeView, Partition, PendingJob, Policy, PriorityWeights, Qos,
                              Reason, RunningJob, Shrinkable, Snapshot, TaskRequest, Topology, schedule)
from corral.scheduler import fairshare
from corral.scheduler.plan import Allocation
from corral.scheduler.core import priorities as core_priorities
from corral.scheduler.dependency import parse
from corral.scheduler.placement import FreePool, place_gang

SITE = Policy.named(
    "slurm",
    partitions=(Partition("batch", nodes=("b-*",), max_time=3600.0, preempt_mode="requeue"),
                Partition("urgent", nodes=("b-*",), priority_tier=10),
                Partition("debug", nodes=("d-*",), accounts=("ml",), job_factor=4.0)),
    qos=(Qos("normal", priority=0), Qos("high", priority=100, preempt=("normal", "low")),
         Qos("low", priority=0, max_gpus_per_user=4, preempt_mode="cancel"),
         Qos("capped", max_gpus=6, gpu_minutes=120.0)),
    accounts=(Account("ml", shares=3, users=("ann", "bob")), Account("vision", parent="ml", shares=1),
              Account("physics", shares=1, max_gpus=8, gpu_minutes=600.0)),
    topology=("leaf", "spine"))


def pj(job_id: int, gpus: int = 1, replicas: int = 1, *, user: str = "ann", account: str = "ml",
       partition: str = "batch", qos: str = "normal", limit: float | None = 600.0, submitted: float = 0.0,
       deps: tuple[Dependency, ...] = (), name: str = "", topology: Topology | None = None,
       kill: bool = False) -> PendingJob:
    t = TaskRequest("t", replicas, gpus, 0.1, 0.0, None, topology)
    return PendingJob(job_id, (t,), submitted, user, account, limit, 0, partition, qos, None, deps, name, kill)


def nodes(n: int = 2, prefix: str = "b", gpus: int = 8, per_leaf: int = 0) -> list[NodeView]:
    return [NodeView(f"{prefix}-{i}", gpus, 64, 512, None,
                     ((("leaf", f"l{i // per_leaf}"), ("spine", "s0")) if per_leaf else ())) for i in range(n)]


def running_on(pool_nodes: list[NodeView], *jobs: tuple[PendingJob, float]) -> tuple[tuple[NodeView, ...],
                                                                                    tuple[RunningJob, ...]]:
    """Place jobs on an idle pool; return the pool as free views and the running jobs."""
    pool = FreePool(pool_nodes)
    out = []
    for job, started in jobs:
        allocs = place_gang(pool, job)
        assert allocs is not None
        out.append(RunningJob(job.id, allocs, started + (job.time_limit or 1e9), job.user, job.account, job.partition,
                              job.qos, started, 0.0, name=job.name))
    free = pool.views()
    return free, tuple(out)


# -- partitions -------------------------------------------------------------------------
def test_a_job_runs_only_on_its_partitions_nodes() -> None:
    snap = Snapshot(tuple(nodes(1, "b") + nodes(1, "d")), (pj(1, partition="debug"), pj(2)))
    plan = schedule(snap, 0.0, SITE)
    where = {s.job_id: s.allocations[0].node for s in plan.starts}
    assert where == {1: "d-0", 2: "b-0"}


def test_partition_time_limit_holds_the_job_with_a_reason() -> None:
    snap = Snapshot(tuple(nodes(1)), (pj(1, limit=7200.0), pj(2, limit=None), pj(3, limit=60.0)))
    plan = schedule(snap, 0.0, SITE)
    assert plan.reasons[1] == Reason.PARTITION_TIME
    assert [s.job_id for s in plan.starts] == [2, 3]  # no limit: the server gives it the partition's


def test_higher_partition_tier_goes_first_whatever_the_priority() -> None:
    snap = Snapshot(tuple(nodes(1)), (pj(1, gpus=8, submitted=-1e6), pj(2, gpus=8, partition="urgent")))
    plan = schedule(snap, 0.0, SITE)
    assert [s.job_id for s in plan.starts] == [2]


def test_partition_and_qos_factors_raise_priority() -> None:
    from corral.scheduler import priorities
    snap = Snapshot(tuple(nodes(1, "b") + nodes(1, "d")), (pj(1), pj(2, partition="debug"), pj(3, qos="high")))
    prio = priorities(snap, 0.0, SITE)
    assert prio[2].partition == 1.0 and prio[1].partition == 0.25
    assert prio[3].qos == 1.0 and prio[1].qos == 0.0
    assert prio[3].total > prio[1].total


# -- limits ----------------------------------------------------------------------------
def test_qos_gpus_per_user_hold_at_every_instant() -> None:
    free, run = running_on(nodes(2), (pj(9, gpus=3, qos="low"), 0.0))
    snap = Snapshot(free, (pj(1, gpus=2, qos="low"), pj(2, gpus=1, qos="low"), pj(3, gpus=2, qos="low", user="bob")),
                    run)
    plan = schedule(snap, 0.0, SITE)
    assert plan.reasons[1] == Reason.QOS_USER_GPUS
    assert sorted(s.job_id for s in plan.starts) == [2, 3]  # 3 + 1 = 4 for ann; bob has his own 4


def test_qos_group_gpus_and_gpu_minute_budget() -> None:
    snap = Snapshot(tuple(nodes(2)), (pj(1, gpus=4, qos="capped", limit=600.0), pj(2, gpus=4, qos="capped", limit=60.0)),
                    gpu_minutes={"qos:capped": 0.0})
    plan = schedule(snap, 0.0, SITE)
    # job 1 would commit 4 GPUs x 10 min = 40 GPU-min; then job 2 breaks max_gpus 6
    assert [s.job_id for s in plan.starts] == [1] and plan.reasons[2] == Reason.QOS_GPUS
    spent = Snapshot(tuple(nodes(2)), (pj(3, gpus=2, qos="capped", limit=1800.0),), gpu_minutes={"qos:capped": 90.0})
    assert schedule(spent, 0.0, SITE).reasons[3] == Reason.QOS_GPU_MINUTES  # 90 + 60 > 120


def test_account_limits_cover_sub_accounts() -> None:
    policy = Policy.named("slurm", accounts=(Account("org", max_gpus=4), Account("team", parent="org")))
    free, run = running_on(nodes(2), (pj(9, gpus=3, account="team"), 0.0))
    snap = Snapshot(free, (pj(1, gpus=2, account="team"), pj(2, gpus=1, account="org")), run)
    plan = schedule(snap, 0.0, policy)
    assert plan.reasons[1] == Reason.ACCOUNT_GPUS and [s.job_id for s in plan.starts] == [2]
    budget = Policy.named("slurm", accounts=(Account("physics", gpu_minutes=600.0),))
    snap = Snapshot(tuple(nodes(1)), (pj(3, gpus=8, account="physics", limit=3600.0),),
                    gpu_minutes={"account:physics": 500.0})
    assert schedule(snap, 0.0, budget).reasons[3] == Reason.ACCOUNT_GPU_MINUTES


@st.composite
def limited_world(draw):
    jobs = [pj(i, gpus=draw(st.integers(1, 4)), user=draw(st.sampled_from(["ann", "bob", "cy"])),
               account=draw(st.sampled_from(["ml", "physics", "vision"])), qos=draw(st.sampled_from(["low", "capped"])),
               limit=float(draw(st.integers(1, 40)) * 60), submitted=float(i)) for i in range(1, draw(st.integers(2, 14)))]
    spent = {"qos:capped": float(draw(st.integers(0, 100))), "account:physics": float(draw(st.integers(0, 500)))}
    return Snapshot(tuple(nodes(draw(st.integers(1, 3)), gpus=8)), tuple(jobs), gpu_minutes=spent)


@settings(max_examples=200, deadline=None)
@given(limited_world())
def test_limits_hold_for_every_plan(snap: Snapshot) -> None:
    plan = schedule(snap, 0.0, SITE)
    jobs = {j.id: j for j in snap.pending}
    per_user: dict[str, int] = defaultdict(int)
    qos_gpus: dict[str, int] = defaultdict(int)
    minutes = dict(snap.gpu_minutes)
    physics = 0
    for start in plan.starts:
        job = jobs[start.job_id]
        if job.qos == "low":
            per_user[job.user] += job.gpus
        qos_gpus[job.qos] += job.gpus
        if job.qos == "capped":
            minutes["qos:capped"] += job.gpus * job.time_limit / 60
        if job.account == "physics":
            physics += job.gpus
            minutes["account:physics"] += job.gpus * job.time_limit / 60
    assert all(v <= 4 for v in per_user.values())
    assert qos_gpus["capped"] <= 6 and minutes["qos:capped"] <= 120.0 + 1e-6
    assert physics <= 8 and minutes["account:physics"] <= 600.0 + 1e-6


# -- dependencies ------------------------------------------------------------------------
def test_dependency_kinds() -> None:
    after = parse("afterok:7,afterany:8")
    snap = Snapshot(tuple(nodes(1)), (pj(1, deps=after),), job_states={7: "RUNNING", 8: "FAILED"})
    assert schedule(snap, 0.0, SITE).reasons[1] == Reason.DEPENDENCY
    done = Snapshot(tuple(nodes(1)), (pj(1, deps=after),), job_states={7: "SUCCEEDED", 8: "FAILED"})
    assert [s.job_id for s in schedule(done, 0.0, SITE).starts] == [1]
    never = Snapshot(tuple(nodes(1)), (pj(1, deps=after), pj(2, deps=parse("afternotok:9"), kill=True)),
                     job_states={7: "FAILED", 8: "FAILED", 9: "SUCCEEDED"})
    plan = schedule(never, 0.0, SITE)
    assert plan.reasons[1] == plan.reasons[2] == Reason.DEPENDENCY_NEVER
    assert list(plan.cancels) == [2]  # only the job that asked to be cancelled
    assert schedule(Snapshot(tuple(nodes(1)), (pj(3, deps=parse("afterany:99")),)), 0.0, SITE).reasons[3] == \
        Reason.DEPENDENCY_NEVER  # an unknown job


def test_singleton_runs_one_job_of_a_name_at_a_time() -> None:
    free, run = running_on(nodes(1), (pj(9, name="sweep"), 0.0))
    single = parse("singleton")
    snap = Snapshot(free, (pj(1, name="sweep", deps=single), pj(2, name="sweep", deps=single, user="bob")), run)
    plan = schedule(snap, 0.0, SITE)
    assert plan.reasons[1] == Reason.DEPENDENCY and [s.job_id for s in plan.starts] == [2]
    queued = Snapshot(tuple(nodes(1)), (pj(1, name="sweep", deps=single), pj(2, name="sweep", deps=single)))
    assert [s.job_id for s in schedule(queued, 0.0, SITE).starts] == [1]


@pytest.mark.parametrize("text, error", [("afterok", "needs at least one"), ("aftercorr:1", "unknown dependency"),
                                          ("singleton:3", "no job ids"), ("afterok:x", "job ids")])
def test_dependency_parse_errors(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text)


# -- topology ----------------------------------------------------------------------------
def test_multi_node_task_lands_under_one_leaf_when_it_can() -> None:
    pool = nodes(8, per_leaf=4)
    busy = [n if n.name not in ("b-0", "b-5") else NodeView(n.name, 8, 64, 512, None, n.labels, frozenset())
            for n in pool]
    # leaf l0 has 3 free nodes, l1 has 3: a 3-node task fits under either, never across
    plan = schedule(Snapshot(tuple(busy), (pj(1, gpus=8, replicas=3),)), 0.0, SITE)
    leaves = {int(a.node.split("-")[1]) // 4 for a in plan.starts[0].allocations}
    assert len(leaves) == 1


def test_fewest_leaves_then_required_level_waits_then_relaxes() -> None:
    pool = nodes(8, per_leaf=4)
    busy = [n if n.name not in ("b-0", "b-1", "b-4") else NodeView(n.name, 8, 64, 512, None, n.labels, frozenset())
            for n in pool]  # l0: 2 free nodes, l1: 3 free
    spread = schedule(Snapshot(tuple(busy), (pj(1, gpus=8, replicas=4),)), 0.0, SITE)
    assert {a.node for a in spread.starts[0].allocations} >= {"b-5", "b-6", "b-7"}  # the bigger leaf first
    need = Topology("leaf", required=True, max_wait=600.0)
    waiting = schedule(Snapshot(tuple(busy), (pj(1, gpus=8, replicas=4, topology=need),)), 100.0, SITE)
    assert waiting.starts == [] and waiting.reasons[1] == Reason.TOPOLOGY
    relaxed = schedule(Snapshot(tuple(busy), (pj(1, gpus=8, replicas=4, topology=need),)), 700.0, SITE)
    assert len(relaxed.starts) == 1


# -- preemption --------------------------------------------------------------------------
def test_higher_tier_preempts_the_least_work_and_only_what_it_needs() -> None:
    free, run = running_on(nodes(2), (pj(10, gpus=8), 0.0), (pj(11, gpus=4), 50.0), (pj(12, gpus=4), 10.0))
    snap = Snapshot(free, (pj(1, gpus=4, partition="urgent"),), run)
    plan = schedule(snap, 100.0, SITE)
    assert plan.starts == [] and plan.reasons[1] == Reason.PREEMPTING
    assert [p.victims for p in plan.preemptions] == [(11,)]  # the most recently started 4-GPU job


def test_equal_tier_needs_a_qos_that_may_preempt() -> None:
    free, run = running_on(nodes(1), (pj(10, gpus=8, qos="normal"), 0.0))
    assert schedule(Snapshot(free, (pj(1, gpus=8, qos="normal"),), run), 1.0, SITE).preemptions == []
    plan = schedule(Snapshot(free, (pj(1, gpus=8, qos="high"),), run), 1.0, SITE)
    assert plan.preemptions[0].victims == (10,)


def test_jobs_already_being_stopped_are_waited_for_not_preempted_again() -> None:
    free, run = running_on(nodes(1), (pj(10, gpus=8), 0.0))
    ending = tuple(RunningJob(r.id, r.allocations, 5.0, r.user, r.account, r.partition, r.qos, r.started_at, ending=True)
                   for r in run)
    plan = schedule(Snapshot(free, (pj(1, gpus=8, partition="urgent"),), ending), 1.0, SITE)
    assert plan.preemptions == [] and plan.reasons[1] == Reason.PREEMPTING


def test_an_elastic_task_is_shrunk_toward_its_minimum_before_any_job_is_preempted() -> None:
    rollout = pj(10, gpus=2, replicas=4)
    free, run = running_on(nodes(1), (rollout, 0.0), (pj(11, gpus=0), 0.0))
    elastic = RunningJob(10, run[0].allocations, 1e9, "ann", "ml", "batch", "normal", 0.0,
                         elastic=(Shrinkable("t", 1, run[0].allocations),))
    plan = schedule(Snapshot(free, (pj(1, gpus=4, partition="urgent"),), (elastic,)), 1.0, SITE)
    (found,) = plan.preemptions
    assert found.victims == () and [(s.job_id, s.task, s.replicas) for s in found.shrinks] == [(10, "t", 2)]


def test_what_a_preempting_job_will_use_is_not_backfilled_meanwhile() -> None:
    """Half the node is free, the rest held by a job the urgent one preempts: a small job
    behind it must not take the free half, or the next cycle would preempt it in turn, and
    so on for ever (the simulator's livelock)."""
    free, run = running_on(nodes(1), (pj(10, gpus=4), 0.0))
    plan = schedule(Snapshot(free, (pj(1, gpus=8, partition="urgent"), pj(2, gpus=2)), run), 1.0, SITE)
    assert [p.victims for p in plan.preemptions] == [(10,)]
    assert plan.starts == []


def test_replicas_a_shrink_is_stopping_count_as_freed_soon() -> None:
    rollout = pj(10, gpus=1, replicas=6)
    free, run = running_on(nodes(1), (rollout, 0.0), (pj(11, gpus=2), 0.0))
    shrinking = replace(run[0], stopping=run[0].allocations[2:])  # 6 -> 2, in its grace period
    plan = schedule(Snapshot(free, (pj(1, gpus=4, partition="urgent"),), (shrinking, run[1])), 1.0, SITE)
    assert plan.preemptions == [] and plan.reasons[1] == Reason.PREEMPTING  # waits for them: no new victim
    bigger = schedule(Snapshot(free, (pj(1, gpus=6, partition="urgent"),), (shrinking, run[1])), 1.0, SITE)
    assert [p.victims for p in bigger.preemptions] == [(11,)]  # the stopping four and job 11's two


def test_preemption_places_the_gang_where_it_found_room() -> None:
    # Two 4-GPU nodes held by an ending job: x has no memory, y has plenty. The gang's "a"
    # (more CPUs, so placed first) goes to x, "b" (64 GB) to y. Undoing that what-if puts
    # y before x in their bucket; placing afresh would put "a" on y and find no node for "b"
    # (best fit: first fit walks nodes in a fixed order).
    x = NodeView("b-x", 4, 8, 0, None, free_gpus=frozenset(), free_cpus=6)
    y = NodeView("b-y", 4, 8, 256, None, free_gpus=frozenset(), free_cpus=6)
    ending = RunningJob(9, (Allocation("t", 0, "b-x", (0, 1, 2, 3), 2.0, 0.0),
                            Allocation("t", 0, "b-y", (0, 1, 2, 3), 2.0, 0.0)), 1e9, "bob", "ml", "batch", ending=True)
    gang = PendingJob(1, (TaskRequest("b", 1, 4, 0.5, 64.0), TaskRequest("a", 1, 4, 1.0, 0.0)), 0.0, "ann", "ml",
                      600.0, 0, "urgent")
    plan = schedule(Snapshot((x, y), (gang,), (ending,)), 1.0, replace(SITE, packing="best_fit"))
    assert plan.reasons[1] == Reason.PREEMPTING and plan.preemptions == []  # the ending job's room is enough
    assert plan.starts == []


@st.composite
def contest(draw):
    tiers = draw(st.lists(st.sampled_from(["batch", "urgent"]), min_size=2, max_size=5))
    qos = draw(st.lists(st.sampled_from(["normal", "high", "low"]), min_size=len(tiers), max_size=len(tiers)))
    gpus = draw(st.lists(st.integers(4, 8), min_size=len(tiers), max_size=len(tiers)))
    return list(zip(tiers, qos, gpus))


@settings(max_examples=150, deadline=None)
@given(contest())
def test_no_two_jobs_ever_preempt_each_other(jobs: list[tuple[str, str, int]]) -> None:
    """Replay cycles on one 8-GPU node: preempted jobs are requeued (pending again) and
    every job keeps trying; no pair may preempt each other in either order."""
    policy = Policy.named("slurm", partitions=SITE.partitions, qos=tuple(
        Qos(q.name, q.priority, q.preempt) for q in SITE.qos))  # no per-user caps here
    specs = {i + 1: pj(i + 1, gpus=g, partition=p, qos=q, limit=None, submitted=float(i))
             for i, (p, q, g) in enumerate(jobs)}
    running: dict[int, RunningJob] = {}
    pending = set(specs)
    preempted: set[tuple[int, int]] = set()
    for cycle in range(12):
        pool = FreePool(nodes(1))
        for r in running.values():
            for a in r.allocations:
                pool.assume(a)
        plan = schedule(Snapshot(pool.views(), tuple(specs[i] for i in sorted(pending)), tuple(running.values())),
                        float(cycle), policy)
        for p in plan.preemptions:
            for victim in p.victims:
                assert (victim, p.for_job) not in preempted, "a preemption cycle"
                preempted.add((p.for_job, victim))
                running.pop(victim)
                pending.add(victim)  # requeued
        for s in plan.starts:
            job = specs[s.job_id]
            running[s.job_id] = RunningJob(s.job_id, s.allocations, 1e9, job.user, job.account, job.partition,
                                           job.qos, float(cycle))
            pending.discard(s.job_id)


# -- fair share over the tree ------------------------------------------------------------
def test_account_tree_shares_and_effective_usage() -> None:
    policy = Policy(accounts=(Account("ml", shares=3), Account("physics", shares=1)))
    rows = {(r.account, r.user): r for r in fairshare.report(policy, {("ml", "ann"): 75.0, ("physics", "cy"): 25.0})}
    assert rows[("ml", "")].norm_shares == pytest.approx(0.75)
    assert rows[("ml", "")].fair_share == pytest.approx(0.5)  # used exactly its share
    assert rows[("physics", "cy")].fair_share == pytest.approx(0.5)
    heavy = {(r.account, r.user): r for r in fairshare.report(policy, {("ml", "ann"): 100.0}, {("physics", "cy")})}
    assert heavy[("ml", "ann")].fair_share < 0.5 < heavy[("physics", "cy")].fair_share


def test_the_same_snapshot_gives_the_same_plan_with_policy() -> None:
    free, run = running_on(nodes(4, per_leaf=2), (pj(10, gpus=8), 0.0), (pj(11, gpus=4), 5.0))
    snap = Snapshot(free, tuple(pj(i, gpus=1 + i % 8, replicas=1 + i % 2, partition=["batch", "urgent"][i % 2],
                                   submitted=float(i)) for i in range(1, 20)), run)
    assert schedule(snap, 50.0, SITE) == schedule(snap, 50.0, SITE)


def test_builders_still_cover_plain_jobs() -> None:
    plan = schedule(Snapshot((node("b-n", gpus=2),), (PendingJob(1, (task("a", gpus=2),)),)), 0.0, SITE)
    assert len(plan.starts) == 1


def test_size_fades_with_age_so_a_passed_over_gang_queues_first() -> None:
    """A size factor weighted no more than age favours small gangs among young jobs only: at
    max_age a job ranks by age alone, ahead of every younger job, however small (slurm's
    factor never fades). corral's default weighs size above age: there the fade stops where
    the job's priority would fall, and the starve limit bounds the wait instead (test_backfill)."""
    corral, slurm = CORRAL_BY_GPUS, Policy.named("slurm")
    day = 86400.0
    big_old = pj(1, gpus=8, replicas=2, submitted=0.0)
    small_new = pj(2, gpus=1, submitted=3 * day - 60)
    big_young = pj(3, gpus=8, replicas=2, submitted=3 * day - 60)  # as young: expansion ties
    snap = Snapshot(tuple(nodes(4)), (big_old, small_new, big_young))
    ranks = core_priorities(snap, 3 * day, corral)
    assert ranks[1].job_size == 0.0 and ranks[1].age == 1.0
    assert ranks[1].total > ranks[2].total > ranks[3].total  # old gang first; young: small before big
    assert core_priorities(snap, 3 * day, slurm)[1].job_size > 0  # Slurm's factor never fades
    # past max_age the queue is by age alone: the older gang ties with a small job also past
    # it (submit order puts the gang first); without the fade the small one always passes it
    small_old = pj(4, gpus=1, submitted=day)
    later = Snapshot(tuple(nodes(4)), (big_old, small_old))
    faded = core_priorities(later, 5 * day, corral)
    assert faded[1].total == faded[4].total
    assert [s.job_id for s in schedule(Snapshot(tuple(nodes(2)), (small_old, big_old)), 5 * day, corral).starts] == [1]
    unfaded = core_priorities(later, 5 * day, Policy.named("slurm", weights=PriorityWeights(
        favor_small=True, age=5000.0, max_age_s=3 * day)))
    assert unfaded[4].total > unfaded[1].total


def test_main_scheduler_pass_stops_a_partition_at_its_first_blocked_job() -> None:
    """``full=False`` (Slurm's main scheduler between backfill passes): priority order, the
    first job that does not fit blocks the rest of its partition, no reservations."""
    policy = Policy.named("slurm", partitions=(Partition("batch", nodes=("b-*",)), Partition("debug", nodes=("d-*",))))
    pool_nodes = nodes(2) + nodes(1, prefix="d")
    hog = pj(9, gpus=6)
    free, running = running_on(pool_nodes, (hog, 0.0))
    big = pj(1, gpus=8, replicas=2, submitted=0.0)  # needs both b nodes: blocked
    small = pj(2, gpus=1, submitted=10.0, limit=60.0)  # fits now on b-1, but behind the blocked one
    other = pj(3, gpus=2, partition="debug", submitted=20.0)
    snap = Snapshot(free, (big, small, other), running)
    quick = schedule(snap, 30.0, policy, full=False)
    assert {s.job_id for s in quick.starts} == {3}
    assert quick.reasons[2] is Reason.PRIORITY and not quick.reserved_starts
    full = schedule(snap, 30.0, policy)
    assert {s.job_id for s in full.starts} == {2, 3} and 1 in full.reserved_starts  # backfilled around it


def test_expansion_factor_is_the_wait_over_the_jobs_own_limit_capped() -> None:
    """The expansion factor (Maui's XFACTOR, a site knob): waited / min(time limit, cap), at
    most 1; a job with no limit counts as the cap; limits under a minute count as a minute.
    Slurm has no such factor, and corral's default weighs it 0."""
    hour = 3600.0
    corral = Policy.named("corral", weights=replace(CORRAL_BY_GPUS.weights, expansion=10000.0))
    jobs = (pj(1, limit=900.0, submitted=0.0),  # 300 s of 900
            pj(2, limit=2 * 86400.0, submitted=300.0 - 12 * hour),  # 12 h of the 1-day cap
            pj(3, limit=None, submitted=300.0 - 12 * hour),  # no limit: the cap
            pj(4, limit=10.0, submitted=270.0),  # 30 s of the one-minute floor
            pj(5, limit=100.0, submitted=0.0))  # waited 3 × its limit: saturated
    got = core_priorities(Snapshot(tuple(nodes(1)), jobs), 300.0, corral)
    assert [round(got[i].expansion, 6) for i in range(1, 6)] == [round(1 / 3, 6), 0.5, 0.5, 0.5, 1.0]
    # weighted into the total: job 5 (saturated) is 10000 × 2/3 above job 1 otherwise alike
    assert got[5].total - got[1].total == pytest.approx(corral.weights.expansion * (1 - 1 / 3), abs=1.0)
    for plain in (Policy.named("slurm"), CORRAL_BY_GPUS):  # (by GPUs: the limits differ)
        ranks = core_priorities(Snapshot(tuple(nodes(1)), jobs), 300.0, plain)
        assert ranks[5].total == pytest.approx(ranks[1].total)  # without the factor the two are alike
    wider = Policy.named("corral", weights=replace(corral.weights, expansion_cap_s=48 * hour))
    assert core_priorities(Snapshot(tuple(nodes(1)), jobs), 300.0, wider)[2].expansion == pytest.approx(0.25)
