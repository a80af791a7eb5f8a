"""Placement of multi-node service replicas (gangs): each gang's members on distinct nodes,
different gangs free to share one, a gang's waiting members kept off the nodes its running
members hold; refused or given BadConstraints with a sentence when the pool has too few
nodes; and the scheduler's invariants under hypothesis with gangs in the queue."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, snapshot, task
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.control.scaling import Scaling
from corral.scheduler import Reason, schedule
from corral.scheduler.placement import FreePool, Scope, place_gang, why_infeasible
from corral.scheduler.policy import Policy
from corral.spec import load_job
from corral.states import JobState, ReplicaState


def gangs(name: str = "llm", replicas: int = 4, gang: int = 2, gpus: int = 1, **more) -> object:
    return replace(task(name, replicas, gpus=gpus), gang=gang, **more)


def nodes_of(allocs) -> dict[int, str]:
    return {a.rank: a.node for a in allocs}


def test_best_fit_would_pack_a_gang_on_one_node_but_its_members_go_apart() -> None:
    pool = FreePool([node("a", gpus=4), node("b", gpus=4)])
    placed = nodes_of(place_gang(pool, job(1, gangs(replicas=2))))
    assert placed[0] != placed[1]
    # without gangs the same two replicas share a node (best fit): the rule is the gang's
    pool = FreePool([node("a", gpus=4), node("b", gpus=4)])
    placed = nodes_of(place_gang(pool, job(1, task("llm", 2, gpus=1))))
    assert placed[0] == placed[1]


def test_different_gangs_share_nodes() -> None:
    pool = FreePool([node("a", gpus=4), node("b", gpus=4)])
    placed = nodes_of(place_gang(pool, job(1, gangs(replicas=6))))
    for head in (0, 2, 4):
        assert placed[head] != placed[head + 1]
    assert set(placed.values()) == {"a", "b"}  # three gangs on two nodes


def test_a_gang_wider_than_the_pool_is_refused_naming_the_field() -> None:
    nodes = [node("a", gpus=8)]
    why = why_infeasible(nodes, job(1, gangs(replicas=2)))
    assert why is not None and "num_nodes: 2 under service:" in why and "1 node(s)" in why
    plan = schedule(snapshot(nodes, [job(1, gangs(replicas=2))]), 0)
    assert plan.reasons == {1: Reason.CONSTRAINT} and not plan.starts
    # on nodes that are only busy, it waits for resources like any gang
    busy = [node("a", gpus=8, free_gpus=set()), node("b", gpus=8, free_gpus=set())]
    assert schedule(snapshot(busy, [job(1, gangs(replicas=2))]), 0).reasons == {1: Reason.RESOURCES}


def test_a_pending_gang_the_pool_shrank_below_says_why() -> None:
    from corral.control.scheduling import Scheduling

    nodes = [node("a", gpus=8)]  # admitted on two nodes; one has left the pool since
    why = Scheduling._constraint(snapshot(nodes, [job(1, gangs(replicas=2))]), 1)
    assert why.startswith("cannot start until more nodes join") and "1 node(s) of the pool could hold" in why


def test_waiting_members_avoid_the_nodes_their_running_mates_hold() -> None:
    pool = FreePool([node("a", gpus=4), node("b", gpus=4, free_gpus={0})])
    alloc = place_gang(pool, job(1, gangs(replicas=1, avoid=frozenset({"b"}))))
    assert nodes_of(alloc) == {0: "a"}
    pool = FreePool([node("a", gpus=4)])
    assert place_gang(pool, job(1, gangs(replicas=1, avoid=frozenset({"a"})))) is None
    why = why_infeasible([node("a", gpus=4)], job(1, gangs(replicas=1, avoid=frozenset({"a"}))))
    assert "besides a, which its running members hold" in why


def test_topology_placement_keeps_gang_members_apart() -> None:
    labelled = [replace(node(n, gpus=4), labels=(("leaf", "l0"),)) for n in ("a", "b")]
    pool = FreePool(labelled)
    allocs = place_gang(pool, job(1, gangs(replicas=4)), Scope(levels=("leaf",)))
    placed = nodes_of(allocs)
    assert placed[0] != placed[1] and placed[2] != placed[3]
    plan = schedule(snapshot(labelled, [job(1, gangs(replicas=4))]), 0, Policy(topology=("leaf",)))
    placed = nodes_of(plan.starts[0].allocations)
    assert placed[0] != placed[1] and placed[2] != placed[3]


def test_a_replaced_member_is_asked_off_its_mates_node() -> None:
    spec = load_job("name: llm\nnum_nodes: 2\nservice:\n  readiness_probe: /\n  replicas: 2\n  ports: 8080\n"
                    "run: x\n").spec.tasks[0]
    rec = TaskRec(1, "llm", True, 4, 1, None, 0.1, 0.0, 5.0, 0.0, None, None, spec.model_dump(mode="json"))
    running = JobRec(1, "llm", "ann", False, JobState.RUNNING, 0.0, False, tasks=[rec])
    for rank, where in enumerate(("n0", "n1", "n0", "n1")):
        running.replicas.append(ReplicaRec(rank + 1, 1, "llm", rank, ReplicaState.RUNNING, node=where))
    running.replicas[3].state, running.replicas[3].node = ReplicaState.PENDING, None  # its node went away
    book = type("Book", (), {"active": {1: running}})()
    (request,) = Scaling(book, None, None, None).requests(0.0)
    (asked,) = request.tasks
    assert asked.replicas == 1 and asked.gang == 2 and asked.avoid == frozenset({"n0"})


# -- invariants under hypothesis ------------------------------------------------------------------------
node_strategy = st.builds(lambda i, g: node(f"n{i}", gpus=g, cpus=8.0, memory=64),
                          st.integers(0, 1000), st.integers(0, 8))
task_strategy = st.builds(lambda i, g, n, gpus: gangs(f"t{i}", g * n, g, gpus), st.integers(0, 3),
                          st.integers(1, 3), st.integers(1, 3), st.integers(0, 4))


@st.composite
def cluster_and_gangs(draw):
    nodes = draw(st.lists(node_strategy, min_size=1, max_size=6, unique_by=lambda n: n.name))
    jobs = [job(j, *draw(st.lists(task_strategy, min_size=1, max_size=2, unique_by=lambda t: t.name)))
            for j in range(1, draw(st.integers(1, 8)) + 1)]
    return nodes, jobs, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(cluster_and_gangs())
def test_gangs_apart_never_overcommitted_and_all_or_none(data) -> None:
    nodes, jobs, switches = data
    if switches:
        nodes = [replace(n, labels=(("leaf", f"l{i % 2}"),)) for i, n in enumerate(nodes)]
    plan = schedule(snapshot(nodes, jobs), 0, Policy(topology=("leaf",) if switches else ()))
    by_name = {n.name: n for n in nodes}
    used: dict[str, set[int]] = defaultdict(set)
    for start in plan.starts:
        pending = next(j for j in jobs if j.id == start.job_id)
        assert len(start.allocations) == sum(t.replicas for t in pending.tasks)  # whole gang
        members: dict[tuple[str, int], list[str]] = defaultdict(list)
        for a in start.allocations:
            assert set(a.gpus) <= set(range(by_name[a.node].gpus))
            assert not used[a.node] & set(a.gpus), "a GPU was given twice"
            used[a.node] |= set(a.gpus)
            members[(a.task, a.rank // pending.task_named(a.task).gang)].append(a.node)
        for where in members.values():
            assert len(where) == len(set(where)), f"two members of one gang share a node: {where}"
    assert plan.started_ids() | set(plan.reasons) == {j.id for j in jobs}
    # a job whose gang is wider than the nodes that could hold a member is never started and says so
    for pending in jobs:
        wide = any(t.gang > sum(1 for n in nodes if n.gpus >= t.gpus) for t in pending.tasks)
        if wide:
            assert pending.id not in plan.started_ids()
            assert why_infeasible(nodes, pending) is not None
