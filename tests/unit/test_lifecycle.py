"""Job-group lifecycle rules as pure decisions over a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

from builders import GroupBuilder
from corral.control import lifecycle
from corral.control.decisions import EndJob, SetDeadline, Stop, WakeAt
from corral.states import JobState, ReplicaState, TransitionError, check_job_transition

S = ReplicaState


def evaluate(view, now: float) -> SimpleNamespace:  # noqa: ANN001 - a JobView
    """The decisions for a job, sorted by kind (each must be one of the job vocabulary's)."""
    decisions = lifecycle.evaluate(view, now)
    assert all(isinstance(d, (Stop, SetDeadline, EndJob, WakeAt)) for d in decisions)
    ends = [d for d in decisions if isinstance(d, EndJob)]
    wakes = [d.at for d in decisions if isinstance(d, WakeAt)]
    assert len(ends) <= 1 and len(wakes) <= 1
    return SimpleNamespace(stops=[d for d in decisions if isinstance(d, Stop)],
                           deadlines=[d for d in decisions if isinstance(d, SetDeadline)],
                           end=ends[0] if ends else None, wake_at=wakes[0] if wakes else None)


def group() -> GroupBuilder:
    return GroupBuilder().task("trainer", replicas=2).task("rollout", primary=False, replicas=2, delay=30) \
        .task("reward", primary=False, delay=5)


def test_nothing_happens_while_primaries_run() -> None:
    d = evaluate(group().build(), now=100)
    assert not d.stops and not d.deadlines and d.end is None


def test_primaries_done_sets_each_auxiliary_deadline_then_stops_it() -> None:
    g = group().replica("trainer-0", S.SUCCEEDED, 0).replica("trainer-1", S.SUCCEEDED, 0)
    d = evaluate(g.build(), now=100)
    assert {(x.task, x.deadline) for x in d.deadlines} == {("rollout", 130), ("reward", 105)}
    assert not d.stops and d.wake_at == 105
    # with the deadlines persisted, a later look stops only what is due
    g.tasks = [t.__class__(t.name, t.primary, t.termination_delay,
                           {"rollout": 130.0, "reward": 105.0}.get(t.name)) for t in g.tasks]
    d = evaluate(g.build(), now=105)
    assert [s.replica_id for s in d.stops] == [g.id_of("reward-0")] and d.wake_at == 130
    d = evaluate(g.build(), now=131)
    assert {s.replica_id for s in d.stops} == {g.id_of("rollout-0"), g.id_of("rollout-1"), g.id_of("reward-0")}
    assert all(s.cause == "termination_delay" for s in d.stops)


def test_job_succeeds_when_every_replica_ended_and_none_failed_on_its_own() -> None:
    g = group().replica("trainer-0", S.SUCCEEDED, 0).replica("trainer-1", S.SUCCEEDED, 0)
    for label in ("rollout-0", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, stopping=True)
    d = evaluate(g.build(), now=200)
    assert d.end.state == JobState.SUCCEEDED and d.end.exit_code == 0


def test_failed_primary_stops_everything_at_once_and_fails_the_job() -> None:
    g = group().replica("trainer-1", S.FAILED, 3)
    d = evaluate(g.build(), now=10)
    assert {s.replica_id for s in d.stops} == {g.id_of(x) for x in ("trainer-0", "rollout-0", "rollout-1", "reward-0")}
    assert d.end is None  # not until they are down
    for label in ("trainer-0", "rollout-0", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, stopping=True)
    d = evaluate(g.build(), now=11)
    assert d.end.state == JobState.FAILED and d.end.exit_code == 3 and "trainer-1" in d.end.message


def test_a_replica_lost_without_an_exit_code_is_said_so_not_exit_code_none() -> None:
    g = group().replica("trainer-1", S.FAILED, None)
    for label in ("trainer-0", "rollout-0", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, stopping=True)
    d = evaluate(g.build(), now=11)
    assert d.end.state == JobState.FAILED and "None" not in d.end.message and "no exit code" in d.end.message


def test_failed_auxiliary_does_not_stop_primaries_but_fails_the_job() -> None:
    g = group().replica("reward-0", S.FAILED, 1)
    d = evaluate(g.build(), now=10)
    assert not d.stops and d.end is None
    g.replica("trainer-0", S.SUCCEEDED, 0).replica("trainer-1", S.SUCCEEDED, 0)
    g.replica("rollout-0", S.KILLED, 143, True).replica("rollout-1", S.KILLED, 143, True)
    d = evaluate(g.build(), now=50)
    assert d.end.state == JobState.FAILED and d.end.cause == "auxiliary_failed" and d.end.exit_code == 1


def test_cancel_stops_every_live_replica_once() -> None:
    g = group().replica("trainer-0", S.RUNNING, stopping=True)
    g.cancel = True
    d = evaluate(g.build(), now=1)
    assert g.id_of("trainer-0") not in {s.replica_id for s in d.stops}  # already asked
    assert len(d.stops) == 4 and all(s.cause == "cancel" for s in d.stops)
    for label in ("trainer-0", "trainer-1", "rollout-0", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, True)
    assert evaluate(g.build(), now=2).end.state == JobState.CANCELLED


def test_plain_job_is_its_own_primary() -> None:
    g = GroupBuilder().task("main").replica("main-0", S.SUCCEEDED, 0)
    assert evaluate(g.build(), now=1).end.state == JobState.SUCCEEDED
    g = GroupBuilder().task("main").replica("main-0", S.FAILED, 2)
    end = evaluate(g.build(), now=1).end
    assert end.state == JobState.FAILED and end.exit_code == 2


def test_transition_table_refuses_going_back() -> None:
    check_job_transition(JobState.PENDING, JobState.STARTING)
    for old, new in [(JobState.SUCCEEDED, JobState.RUNNING), (JobState.PENDING, JobState.RUNNING),
                     (JobState.CANCELLED, JobState.PENDING)]:
        try:
            check_job_transition(old, new)
        except TransitionError:
            continue
        raise AssertionError(f"{old}->{new} was allowed")


def test_time_limit_stops_everything_and_ends_timeout() -> None:
    g = group()
    g.replicas = [r.__class__(r.id, r.task, r.rank, r.state, r.exit_code, True, True) if r.task == "rollout" and
                  r.rank == 0 else r for r in g.replicas]
    d = evaluate(g.build(), now=5)
    assert {s.cause for s in d.stops} == {"job_time_limit"} and len(d.stops) == 4 and d.end is None
    for label in ("trainer-0", "trainer-1", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, stopping=True)
    g.replicas = [r.__class__(r.id, r.task, r.rank, S.KILLED, 137, True, True) if r.task == "rollout" and r.rank == 0
                  else r for r in g.replicas]
    end = evaluate(g.build(), now=6).end
    assert end.state == JobState.TIMEOUT and "rollout-0" in end.message


def test_nodes_ended_by_their_engine_end_the_job_as_the_engine_said() -> None:
    """A Slurm time limit is TIMEOUT, an scancel from outside CANCELLED: every replica stops,
    and the job ends with the engine's words, not as cancelled by a user."""
    g = group()
    g.ended_by = (JobState.TIMEOUT, "Slurm ended its allocation (job 12: timeout)")
    d = evaluate(g.build(), now=1)
    assert len(d.stops) == 5 and all(s.cause == "allocation_ended" for s in d.stops) and d.end is None
    for label in ("trainer-0", "trainer-1", "rollout-0", "rollout-1", "reward-0"):
        g.replica(label, S.KILLED, 143, stopping=True)
    d = evaluate(g.build(), now=2)
    assert d.end.state == JobState.TIMEOUT and d.end.message == "Slurm ended its allocation (job 12: timeout)"


def batch() -> GroupBuilder:
    """A batch script over three nodes: the script's replica and two holding the other nodes."""
    return GroupBuilder().task("batch").task("node", primary=False, replicas=2, delay=0.0, holds_nodes=True)


def test_a_batch_job_that_loses_a_node_stops_the_script_and_fails_as_slurm_ends_it() -> None:
    g = batch().replica("node-1", S.FAILED, 137)
    d = evaluate(g.build(), now=10)
    assert {s.replica_id for s in d.stops} == {g.id_of("batch-0"), g.id_of("node-0")}
    assert all(s.cause == "node_lost" for s in d.stops) and d.end is None
    g.replica("batch-0", S.KILLED, 143, stopping=True).replica("node-0", S.KILLED, 143, stopping=True)
    d = evaluate(g.build(), now=11)
    assert d.end.state == JobState.FAILED and d.end.exit_code == 137 and d.end.cause == "node_lost"
    assert "node-1" in d.end.message and "loses a node" in d.end.message


def test_holders_stopped_after_the_script_succeeded_end_it_as_usual() -> None:
    g = batch().replica("batch-0", S.SUCCEEDED, 0)
    d = evaluate(g.build(), now=10)
    assert {s.replica_id for s in d.stops} == {g.id_of("node-0"), g.id_of("node-1")}
    g.replica("node-0", S.KILLED, 143, stopping=True).replica("node-1", S.KILLED, 143, stopping=True)
    assert evaluate(g.build(), now=11).end.state == JobState.SUCCEEDED


def test_a_job_with_nothing_left_running_never_stays_running() -> None:
    # a gang member exited 0 without restarting and its peer was stopped with it
    g = GroupBuilder().task("pg", replicas=2).replica("pg-1", S.SUCCEEDED, 0).replica("pg-0", S.KILLED, 143,
                                                                                      stopping=True)
    d = evaluate(g.build(), now=10)
    assert d.end.state == JobState.FAILED and d.end.cause == "nothing_left" and "pg-0" in d.end.message
    # a service scaled to zero has no members: it stays as it is
    assert evaluate(GroupBuilder().task("svc", replicas=0).build(), now=10).end is None
