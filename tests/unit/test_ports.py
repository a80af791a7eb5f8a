"""Declared ports as a node resource (Nomad's static ports), in the pure scheduler: two
replicas holding one port are never placed on one address, whether on one node or on nodes
that share it; nodes whose replicas get addresses of their own have no port limit. And the
blame of a failed job names the replica that failed on its own."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.control.lifecycle import JobView, ReplicaView, TaskView, evaluate
from corral.control.decisions import EndJob
from corral.control.scheduling import Scheduling
from corral.runtime.discovery import port_domain
from corral.scheduler import NodeView, PendingJob, Policy, RunningJob, Snapshot, TaskRequest, schedule
from corral.scheduler.applier import apply_starts
from corral.scheduler.placement import FreePool, place_gang, why_infeasible
from corral.states import JobState, ReplicaState


def node(name: str, address: str | None, gpus: int = 8, held: tuple[int, ...] = ()) -> NodeView:
    return NodeView(name, gpus, 32, 256, "H100", address=address, held_ports=held)


def server(replicas: int = 2, ports: tuple[int, ...] = (8000,), gpus: int = 1, name: str = "server") -> TaskRequest:
    return TaskRequest(name, replicas, gpus, 1, 0, ports=ports)


def test_two_replicas_of_one_port_go_to_two_addresses():
    nodes = [node("a", "10.0.0.1"), node("b", "10.0.0.2")]
    placed = place_gang(FreePool(nodes), PendingJob(1, (server(),)))
    assert placed is not None
    assert sorted(a.node for a in placed) == ["a", "b"]  # best fit alone would pack both on one node
    assert all(a.ports == (8000,) for a in placed)


def test_nodes_sharing_an_address_share_its_ports():
    nodes = [node("gpu001", "loopback"), node("gpu002", "loopback")]
    job = PendingJob(1, (server(),))
    assert place_gang(FreePool(nodes), job) is None
    why = why_infeasible(nodes, job)
    assert why is not None and "port 8000" in why and "1 address" in why
    # one replica fits, and a task declaring another port goes beside it
    one = place_gang(FreePool(nodes), PendingJob(2, (server(1), server(1, (9000,), name="other"))))
    assert one is not None and len(one) == 2


def test_replicas_with_addresses_of_their_own_have_no_port_limit():
    nodes = [node("local", None)]
    placed = place_gang(FreePool(nodes), PendingJob(1, (server(3),)))
    assert placed is not None and {a.node for a in placed} == {"local"}
    assert why_infeasible(nodes, PendingJob(1, (server(30, gpus=0),))) is None


def test_a_port_held_by_a_running_replica_waits_until_it_is_released():
    nodes = [node("a", "10.0.0.1", held=(8000,)), node("b", "10.0.0.2")]
    pool = FreePool(nodes)
    first = place_gang(pool, PendingJob(1, (server(1),)))
    assert first is not None and first[0].node == "b"
    assert place_gang(pool, PendingJob(2, (server(1),))) is None
    pool.release(first[0])
    again = place_gang(pool, PendingJob(3, (server(1),)))
    assert again is not None and again[0].node == "b"
    assert pool.views()[0].held_ports == (8000,)  # the running replica's, carried into the next snapshot


def test_the_applier_refuses_a_start_whose_port_was_taken_meanwhile():
    nodes = [node("a", "10.0.0.1")]
    plan = schedule(Snapshot(tuple(nodes), (PendingJob(1, (server(1),)),)), 0.0)
    assert [s.job_id for s in plan.starts] == [1]
    pool = FreePool([node("a", "10.0.0.1", held=(8000,))])
    applied, refused = apply_starts(pool, plan)
    assert not applied and [s.job_id for s in refused] == [1]


def test_the_scheduler_waits_and_says_resources_then_starts_once_the_port_is_free():
    holder = node("a", "10.0.0.1", held=(8000,))
    running = RunningJob(7, (), 100.0)
    plan = schedule(Snapshot((holder,), (PendingJob(1, (server(1),)),), (running,)), 0.0)
    assert not plan.starts and plan.reasons[1].value == "Resources"
    plan = schedule(Snapshot((node("a", "10.0.0.1"),), (PendingJob(1, (server(1),)),)), 0.0)
    assert [s.job_id for s in plan.starts] == [1]


def test_a_gang_its_nodes_can_never_hold_by_ports_waits_with_bad_constraints():
    # the nodes provisioned for a job (say a Slurm lab's, all on this machine) share one address
    nodes = tuple(NodeView(f"s1-gpu00{i}", 8, 32, 256, "H100", address="loopback", dedicated_to=1) for i in (1, 2))
    snapshot = Snapshot(nodes, (PendingJob(1, (server(),)),))
    plan = schedule(snapshot, 0.0)
    assert not plan.starts and plan.reasons[1].value == "BadConstraints"
    # and the job's message says which port and why, not only Slurm's one word
    why = Scheduling._constraint(snapshot, 1)
    assert why is not None and "2 replicas declare port 8000" in why and "provisioned for it" in why
    # without nodes yet (an engine provisions them), nothing is said of its ports
    plan = schedule(Snapshot((), (PendingJob(2, (server(),)),)), 0.0)
    assert plan.reasons[2].value != "BadConstraints"


def test_loopback_addresses_are_one_port_domain():
    assert port_domain("127.0.1.1") == port_domain("127.0.1.2") == port_domain("::1") == "loopback"
    assert port_domain("172.31.0.10") == "172.31.0.10"
    assert port_domain("gpu001") == "gpu001"


# -- property: never two replicas holding one port on one address ---------------------------------

ADDRESSES = st.sampled_from([None, "10.0.0.1", "10.0.0.2", "10.0.0.3"])


@st.composite
def cluster_and_jobs(draw):
    nodes = [NodeView(f"n{i}", draw(st.integers(0, 4)), 8, 64, "H100", address=draw(ADDRESSES))
             for i in range(draw(st.integers(1, 5)))]
    jobs = []
    for j in range(draw(st.integers(1, 8))):
        tasks = tuple(TaskRequest(f"t{k}", draw(st.integers(1, 3)), draw(st.integers(0, 2)), draw(st.sampled_from([0.5, 2])),
                                  0, ports=tuple(sorted(draw(st.sets(st.sampled_from([8000, 8001, 9000]), max_size=2)))))
                      for k in range(draw(st.integers(1, 2))))
        jobs.append(PendingJob(j + 1, tasks, float(j), time_limit=draw(st.sampled_from([None, 60.0, 600.0]))))
    split = draw(st.integers(0, len(jobs)))
    policy = draw(st.sampled_from(["fifo", "slurm", "corral"]))
    return nodes, jobs[:split], jobs[split:], Policy.named(policy)


def _held(nodes: list[NodeView], allocations) -> Counter:
    address = {n.name: n.address for n in nodes}
    return Counter((address[a.node], p) for a in allocations if address[a.node] is not None for p in a.ports)


@settings(max_examples=150, deadline=None)
@given(cluster_and_jobs())
def test_no_address_ever_holds_one_port_twice(case):
    nodes, first, second, policy = case
    plan = schedule(Snapshot(tuple(nodes), tuple(first)), 0.0, policy)
    pool = FreePool(nodes)
    applied, _ = apply_starts(pool, plan)
    held = [a for s in applied for a in s.allocations]
    running = tuple(RunningJob(s.job_id, s.allocations, 300.0) for s in applied)
    # a later cycle, with the first one's replicas running and more jobs waiting
    later = schedule(Snapshot(pool.views(), tuple(second), running), 10.0, policy)
    applied2, _ = apply_starts(pool, later)
    held += [a for s in applied2 for a in s.allocations]
    assert all(count == 1 for count in _held(nodes, held).values())
    for start in list(applied) + list(applied2):  # every replica holds what its task declared
        for alloc in start.allocations:
            task = next(t for j in first + second if j.id == start.job_id for t in j.tasks if t.name == alloc.task)
            on_address = next(n.address for n in nodes if n.name == alloc.node) is not None
            assert alloc.ports == (task.ports if on_address else ())


@settings(max_examples=100, deadline=None)
@given(cluster_and_jobs())
def test_a_gang_that_cannot_fit_by_ports_alone_is_explained(case):
    nodes, first, second, _ = case
    for job in first + second:
        if place_gang(FreePool.idle(nodes), job) is None:
            assert why_infeasible(nodes, job)
        else:
            assert why_infeasible(nodes, job) is None


# -- who is blamed ------------------------------------------------------------------------------------

def _group(*replicas: ReplicaView) -> JobView:
    return JobView(1, JobState.RUNNING, False, (TaskView("client", True, 0, None), TaskView("server", False, 0, None)),
                   replicas)


def test_a_primary_that_never_started_because_a_server_failed_names_the_server():
    job = _group(ReplicaView(1, "client", 0, ReplicaState.FAILED, None, False, False, "dependency_failed",
                             "dependency server can no longer become ready"),
                 ReplicaView(2, "server", 0, ReplicaState.KILLED, None, True, False, "primary_failed", ""),
                 ReplicaView(3, "server", 1, ReplicaState.FAILED, 1, False, False, "exited", "exit code 1"))
    end = next(d for d in evaluate(job, 0.0) if isinstance(d, EndJob))
    assert end.state == JobState.FAILED
    assert "client-0" in end.message and "server can no longer become ready" in end.message
    assert "replica server-1 failed first (exit code 1)" in end.message
    assert "lost or killed" not in end.message


def test_the_primary_that_failed_on_its_own_is_blamed_before_one_that_followed():
    job = JobView(1, JobState.RUNNING, False, (TaskView("a", True, 0, None), TaskView("b", True, 0, None)),
                  (ReplicaView(1, "a", 0, ReplicaState.FAILED, None, False, False, "dependency_failed",
                               "dependency b can no longer become started"),
                   ReplicaView(2, "b", 0, ReplicaState.FAILED, 3, False, False, "exited", "exit code 3")))
    end = next(d for d in evaluate(job, 0.0) if isinstance(d, EndJob))
    assert end.message == "primary replica b-0 failed (exit code 3)"
    assert end.exit_code == 3


def test_replicas_already_sharing_a_port_are_counted_not_refused():
    # placed before ports were a resource (two Slurm lab nodes, one machine): the snapshot of
    # what runs takes both, and no new replica of that port goes there until both are gone
    from corral.scheduler import Allocation

    pool = FreePool([node("gpu001", "loopback"), node("gpu002", "loopback")])
    held = [Allocation("server", r, f"gpu00{r + 1}", (0,), 1, 0, (8000,)) for r in (0, 1)]
    for alloc in held:
        pool.assume(alloc, ports=False)
    assert place_gang(pool, PendingJob(2, (server(1),))) is None
    pool.release(held[0])
    assert place_gang(pool, PendingJob(3, (server(1),))) is None
    pool.release(held[1])
    assert place_gang(pool, PendingJob(4, (server(1),))) is not None


def test_a_gang_that_never_fits_by_its_ports_does_not_rule_out_one_alike_without_them():
    # backfill remembers gangs that found no room in a cycle; ports are part of what a gang is
    from corral.scheduler import Allocation

    busy = NodeView("n", 8, 32, 256, "H100", address="10.0.0.1", free_gpus=frozenset(), held_ports=(8000,))
    running = RunningJob(9, (Allocation("x", 0, "n", tuple(range(8)), 1, 0, (8000,)),), 100.0)
    never = PendingJob(1, (server(2),), 0.0)
    alike = PendingJob(2, (server(2, ports=()),), 1.0)
    plan = schedule(Snapshot((busy,), (never, alike), (running,)), 0.0, Policy.named("slurm"))
    assert 1 not in plan.reserved_starts
    assert plan.reserved_starts.get(2) == 100.0
