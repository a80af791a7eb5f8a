"""The pure scheduler: FIFO gang placement, reasons, best-fit packing, and its invariants
(never overcommit, gangs all-or-none, determinism) under hypothesis."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, snapshot, task
from corral.scheduler import Reason, schedule
from corral.scheduler.placement import FreePool, place_gang, why_infeasible


def test_gang_starts_all_replicas_of_all_tasks_together() -> None:
    plan = schedule(snapshot([node("a"), node("b")], [job(1, task("trainer", 1, gpus=8), task("rollout", 2, gpus=4))]), 0)
    (start,) = plan.starts
    assert sorted((a.task, a.rank) for a in start.allocations) == [("rollout", 0), ("rollout", 1), ("trainer", 0)]
    nodes = defaultdict(set)
    for a in start.allocations:
        assert not nodes[a.node] & set(a.gpus), "a GPU was given twice"
        nodes[a.node] |= set(a.gpus)


def test_gang_that_does_not_fit_starts_nothing_and_blocks_fifo() -> None:
    plan = schedule(snapshot([node("a", gpus=8)], [job(1, task(gpus=4)), job(2, task("big", 2, gpus=4)),
                                                    job(3, task(gpus=1))]), 0)
    assert [s.job_id for s in plan.starts] == [1]
    assert plan.reasons == {2: Reason.RESOURCES, 3: Reason.PRIORITY}


def test_gpu_type_is_a_constraint() -> None:
    nodes = [node("a", gpu_type="A100"), node("b", gpu_type="H100")]
    plan = schedule(snapshot(nodes, [job(1, task(gpus=2, gpu_type="h100"))]), 0)
    assert {a.node for a in plan.starts[0].allocations} == {"b"}
    plan = schedule(snapshot(nodes, [job(2, task(gpus=2, gpu_type="B200"))]), 0)
    assert plan.reasons == {2: Reason.GPU_TYPE}


def test_a_type_on_a_pool_of_one_other_type_or_none_is_never_placed() -> None:
    for kind in (None, "A100"):  # one type only: the pool keeps no per-type index
        nodes = [node("a", gpu_type=kind), node("b", gpu_type=kind)]
        plan = schedule(snapshot(nodes, [job(1, task(gpus=1)), job(2, task(gpus=1, gpu_type=kind)),
                                         job(3, task(gpus=1, gpu_type="h100"))]), 0)
        assert [s.job_id for s in plan.starts] == [1, 2]
        assert plan.reasons == {3: Reason.GPU_TYPE}


def test_best_fit_keeps_whole_nodes_free() -> None:
    nodes = [node("a", free_gpus={0, 1, 2, 3, 4, 5, 6, 7}), node("b", free_gpus={6, 7})]
    plan = schedule(snapshot(nodes, [job(1, task(gpus=2)), job(2, task(gpus=8))]), 0)
    first, second = plan.starts
    assert first.allocations[0].node == "b" and first.allocations[0].gpus == (6, 7)
    assert second.allocations[0].node == "a"


def test_cpu_only_replicas_prefer_nodes_without_free_gpus() -> None:
    nodes = [node("gpu", gpus=8), node("cpu", gpus=0, gpu_type=None)]
    plan = schedule(snapshot(nodes, [job(1, task(cpus=1))]), 0)
    assert plan.starts[0].allocations[0].node == "cpu"


def test_fractional_cpus_pack_five_tasks_on_two_cores() -> None:
    five = job(1, *(task(f"t{i}") for i in range(5)))
    plan = schedule(snapshot([node("laptop", gpus=0, cpus=2, gpu_type=None)], [five]), 0)
    assert len(plan.starts[0].allocations) == 5


def test_why_infeasible_names_the_missing_resource() -> None:
    nodes = [node("a", gpus=4, cpus=8, memory=64)]
    assert "8 GPUs" in why_infeasible(nodes, job(1, task(gpus=8)))
    assert "GPU type B200" in why_infeasible(nodes, job(1, task(gpus=1, gpu_type="B200")))
    assert "16 CPUs" in why_infeasible(nodes, job(1, task(cpus=16)))
    assert "memory" in why_infeasible(nodes, job(1, task(memory=128)))
    assert "needs 8 GPUs at once" in why_infeasible(nodes, job(1, task(replicas=2, gpus=4)))
    assert why_infeasible(nodes, job(1, task(gpus=4))) is None


node_strategy = st.builds(lambda i, g, c: node(f"n{i}", gpus=g, cpus=c, memory=64),
                          st.integers(0, 1000), st.integers(0, 8), st.sampled_from([1.0, 2.0, 8.0]))
task_strategy = st.builds(lambda i, r, g, c: task(f"t{i}", r, g, c), st.integers(0, 3), st.integers(1, 3),
                          st.integers(0, 8), st.sampled_from([0.1, 0.5, 1.0, 4.0]))


@st.composite
def cluster_and_queue(draw):
    nodes = draw(st.lists(node_strategy, min_size=1, max_size=6, unique_by=lambda n: n.name))
    jobs = []
    for job_id in range(1, draw(st.integers(1, 12)) + 1):
        tasks = draw(st.lists(task_strategy, min_size=1, max_size=3, unique_by=lambda t: t.name))
        jobs.append(job(job_id, *tasks))
    return nodes, jobs


@settings(max_examples=300, deadline=None)
@given(cluster_and_queue())
def test_never_overcommits_and_gangs_are_all_or_none(data) -> None:
    nodes, jobs = data
    plan = schedule(snapshot(nodes, jobs), 0)
    by_name = {n.name: n for n in nodes}
    used_gpus: dict[str, set[int]] = defaultdict(set)
    used_cpus: dict[str, float] = defaultdict(float)
    for start in plan.starts:
        pending = next(j for j in jobs if j.id == start.job_id)
        assert len(start.allocations) == sum(t.replicas for t in pending.tasks)  # whole gang
        for a in start.allocations:
            assert set(a.gpus) <= set(range(by_name[a.node].gpus))
            assert not used_gpus[a.node] & set(a.gpus)
            used_gpus[a.node] |= set(a.gpus)
            used_cpus[a.node] += a.cpus
            assert used_cpus[a.node] <= by_name[a.node].cpus + 1e-6
    started = plan.started_ids()
    assert started | set(plan.reasons) == {j.id for j in jobs}
    assert not started & set(plan.reasons)
    # FIFO: everything started comes before the first job that waits
    if plan.reasons:
        assert all(j < min(plan.reasons) for j in started)


@settings(max_examples=100, deadline=None)
@given(cluster_and_queue())
def test_same_snapshot_same_plan(data) -> None:
    nodes, jobs = data
    assert schedule(snapshot(nodes, jobs), 0) == schedule(snapshot(nodes, jobs), 5)


@settings(max_examples=200, deadline=None)
@given(cluster_and_queue())
def test_failed_gang_leaves_the_pool_untouched(data) -> None:
    nodes, jobs = data
    pool = FreePool(nodes)
    before = [(n.view.name, frozenset(n.gpus), n.cpus) for n in pool.nodes]
    for pending in jobs:
        if place_gang(pool, pending) is None:
            continue
        before = [(n.view.name, frozenset(n.gpus), n.cpus) for n in pool.nodes]
    assert before == [(n.view.name, frozenset(n.gpus), n.cpus) for n in pool.nodes]


def test_a_requeued_victim_lets_the_job_it_was_preempted_for_go_first() -> None:
    """The victim is older and as high in the queue: without this it took its room back as
    soon as it was free, was preempted again, and the preemptor never started."""
    from dataclasses import replace

    victim = replace(job(1, task(gpus=8), submitted_at=0.0), yields_to=2)
    preemptor = job(2, task(gpus=8), submitted_at=10.0)
    for policy in ("fifo", "slurm", "corral"):
        from corral.scheduler import Policy

        plan = schedule(snapshot([node(gpus=8)], [victim, preemptor]), 20.0, Policy(name=policy))
        assert plan.started_ids() == {2}, (policy, plan)
        assert plan.reasons[1] is Reason.PRIORITY
    # once its preemptor is no longer waiting, the victim is a job like any other
    plan = schedule(snapshot([node(gpus=8)], [victim]), 20.0)
    assert plan.started_ids() == {1}


def test_two_jobs_preempted_for_each_other_in_turn_do_not_wait_for_each_other() -> None:
    from dataclasses import replace

    a = replace(job(1, task(gpus=8), submitted_at=0.0), yields_to=2)
    b = replace(job(2, task(gpus=8), submitted_at=5.0), yields_to=1)
    plan = schedule(snapshot([node(gpus=8)], [a, b]), 20.0)
    assert len(plan.started_ids()) == 1  # one of them runs; neither holds for the other
