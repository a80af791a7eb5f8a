"""The pure supervisor: typed events in, decisions out, checked against the transition
tables. Built from in-memory records and plain floats for time (no clock, no process)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.control.decisions import (MOVES, End, Kill, Relaunch, Replace, RequeueJob, Restart, SetReady, Signal, Stop,
                                      check, target)
from corral.control.supervisor import AttemptEnded, ProbeAnswered, Supervisor
from corral.states import REPLICA_TRANSITIONS, JobState, ReplicaState, TransitionError


def make_job(*tasks: dict, state: JobState = JobState.RUNNING, time_limit: float | None = None) -> JobRec:
    """A running job whose tasks are given as spec dicts (``replicas`` sets the count)."""
    job = JobRec(1, "j", "alice", len(tasks) > 1, state, 0.0, False, time_limit=time_limit)
    rid = 0
    for i, spec in enumerate(tasks):
        spec = dict(spec)
        count = spec.pop("replicas", 1)
        spec.setdefault("run", "true")
        job.tasks.append(TaskRec(i + 1, spec["name"], True, count, 0, None, 0.1, 0.0, 5.0, 0.0, None, None, spec))
        for rank in range(count):
            rid += 1
            job.replicas.append(ReplicaRec(rid, 1, spec["name"], rank, ReplicaState.RUNNING, node="n0",
                                           handle={"pid": 1}, started_at=0.0, attempt=1, ready=True))
    return job


def one(job: JobRec) -> ReplicaRec:
    return job.replicas[0]


ALWAYS = {"policy": "always", "max_restarts": 2, "backoff": {"initial": 1, "factor": 2, "max": 10}}


# -- attempts ending ------------------------------------------------------------------------
def test_a_clean_exit_succeeds_and_a_failure_fails_when_the_policy_says_never() -> None:
    sup, job = Supervisor(), make_job({"name": "main"})
    assert sup.attempt_ended(job, one(job), AttemptEnded(1, 0), 5.0) == [End(1, ReplicaState.SUCCEEDED, "exited",
                                                                             "exit code 0", 0)]
    [end] = sup.attempt_ended(job, one(job), AttemptEnded(1, 3), 5.0)
    assert (end.state, end.exit_code, end.message) == (ReplicaState.FAILED, 3, "exit code 3")


def test_restart_backoff_grows_and_stops_at_max_restarts() -> None:
    sup, job = Supervisor(), make_job({"name": "main", "restart": ALWAYS})
    r = one(job)
    [d] = sup.attempt_ended(job, r, AttemptEnded(1, 1), 10.0)
    assert isinstance(d, Restart) and d.at == 11.0 and "restart 1/2 in 1s" in d.message
    r.restarts = 1
    [d] = sup.attempt_ended(job, r, AttemptEnded(1, 1), 10.0)
    assert isinstance(d, Restart) and d.at == 12.0
    r.restarts = 2
    [d] = sup.attempt_ended(job, r, AttemptEnded(1, 1), 10.0)
    assert isinstance(d, End) and d.state == ReplicaState.FAILED


def test_on_failure_with_exit_codes_restarts_only_those() -> None:
    sup = Supervisor()
    job = make_job({"name": "main", "restart": {"policy": "on_failure", "exit_codes": [75]}})
    assert isinstance(sup.attempt_ended(job, one(job), AttemptEnded(1, 75), 0.0)[0], Restart)
    assert isinstance(sup.attempt_ended(job, one(job), AttemptEnded(1, 1), 0.0)[0], End)
    assert sup.attempt_ended(job, one(job), AttemptEnded(1, 0), 0.0)[0].state == ReplicaState.SUCCEEDED


def test_an_exit_corral_asked_for_is_killed_never_restarted() -> None:
    sup, job = Supervisor(), make_job({"name": "main", "restart": ALWAYS})
    one(job).stop_requested_at, one(job).stop_cause = 1.0, "scale_down"
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, 143), 2.0)
    assert (d.state, d.cause) == (ReplicaState.KILLED, "scale_down")


@pytest.mark.parametrize("why", ["cancel", "preempted"])
def test_no_restart_while_the_job_is_cancelled_or_preempted(why: str) -> None:
    sup, job = Supervisor(), make_job({"name": "main", "restart": ALWAYS})
    if why == "cancel":
        job.cancel_requested = True
    else:
        job.state = JobState.PREEMPTED
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, 1), 2.0)
    assert isinstance(d, End)


def test_lost_with_its_node_requeues_the_job_unless_it_may_restart() -> None:
    sup = Supervisor()
    job = make_job({"name": "main"})
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, None, lost=True, reason="node died", node_up=False), 3.0)
    assert isinstance(d, RequeueJob) and "n0 is down" in d.job_message
    # the node is still there (the process vanished): the replica fails, nothing is requeued
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, None, lost=True, reason="gone", node_up=True), 3.0)
    assert (d.state, d.cause, d.message) == (ReplicaState.FAILED, "lost", "lost: gone")
    job = make_job({"name": "main", "restart": ALWAYS})
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, None, lost=True, reason="node died", node_up=False), 3.0)
    assert isinstance(d, Restart) and d.exit_code is None and "lost (node died)" in d.message


def test_a_lost_exit_code_is_never_taken_as_success() -> None:
    sup, job = Supervisor(), make_job({"name": "main"})
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, 0, lost=True, reason="x"), 3.0)
    assert d.state == ReplicaState.FAILED and d.exit_code is None


def test_an_attempt_ending_on_an_ended_replica_decides_nothing() -> None:
    sup, job = Supervisor(), make_job({"name": "main"})
    one(job).state = ReplicaState.SUCCEEDED
    assert sup.attempt_ended(job, one(job), AttemptEnded(1, 1), 1.0) == []


# -- probes ---------------------------------------------------------------------------------
READY = {"exec": "true", "success_threshold": 2, "failure_threshold": 3}


def test_readiness_thresholds_in_a_row() -> None:
    sup, job = Supervisor(), make_job({"name": "web", "readiness_probe": READY})
    r = one(job)
    r.ready = False
    assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", True), 1.0) == []
    assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", False, "refused"), 2.0) == []
    assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", True), 3.0) == []  # the streak restarted
    assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", True, "200"), 4.0) == [SetReady(1, True, "200")]
    r.ready = True
    for _ in range(2):
        assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", False, "503"), 5.0) == []
    assert sup.probe_answered(job, r, ProbeAnswered(1, "readiness", False, "503"), 6.0) == [SetReady(1, False, "503")]


def test_liveness_failures_send_the_stop_signal_once_with_grace() -> None:
    sup = Supervisor()
    job = make_job({"name": "web", "stop_signal": "SIGINT", "grace_period": 7,
                    "liveness_probe": {"exec": "true", "failure_threshold": 2}})
    r = one(job)
    assert sup.probe_answered(job, r, ProbeAnswered(1, "liveness", False, "x"), 1.0) == []
    [d] = sup.probe_answered(job, r, ProbeAnswered(1, "liveness", False, "x"), 2.0)
    assert d == Signal(1, "SIGINT", "liveness_failed", "liveness probe failed 2x (x)", 7.0)
    r.kill_at = 9.0  # the signal went out: no second one while the grace period runs
    assert sup.probe_answered(job, r, ProbeAnswered(1, "liveness", False, "x"), 3.0) == []
    assert sup.probe_answered(job, r, ProbeAnswered(1, "liveness", False, "x"), 4.0) == []


def test_probe_answers_for_a_replica_not_running_are_ignored() -> None:
    sup, job = Supervisor(), make_job({"name": "web", "readiness_probe": {"exec": "true"}})
    one(job).state, one(job).ready = ReplicaState.RESTARTING, False
    assert sup.probe_answered(job, one(job), ProbeAnswered(1, "readiness", True), 1.0) == []


# -- time -----------------------------------------------------------------------------------
def test_due_restart_relaunches_on_its_node_or_is_placed_again_when_the_node_is_gone() -> None:
    sup, job = Supervisor(), make_job({"name": "main", "restart": ALWAYS})
    r = one(job)
    r.state, r.restart_at, r.handle = ReplicaState.RESTARTING, 10.0, None
    assert sup.review(job, 9.9, lambda n: True) == []
    assert sup.review(job, 10.0, lambda n: True) == [Relaunch(1, "attempt 2")]
    [d] = sup.review(job, 10.0, lambda n: False)
    assert isinstance(d, Replace) and "node is down" in d.message
    r.stop_requested_at = 9.0  # cancelled during the backoff: never started again
    assert sup.review(job, 11.0, lambda n: True) == []


def test_time_limit_warns_once_then_stops() -> None:
    sup = Supervisor()
    job = make_job({"name": "main", "time_limit": 100, "signal_before_timeout": {"signal": "SIGUSR1", "seconds": 30}})
    r = one(job)
    assert sorted(sup.watch(job, r)) == [70.0, 100.0]
    assert sup.review(job, 69.0, lambda n: True) == []
    [warn] = sup.review(job, 70.0, lambda n: True)
    assert isinstance(warn, Signal) and warn.grace is None and warn.signal == "SIGUSR1"
    assert sup.review(job, 80.0, lambda n: True) == []  # once per attempt
    assert sup.review(job, 100.0, lambda n: True) == [Stop(1, "time_limit")]


def test_the_job_time_limit_caps_a_longer_task_limit() -> None:
    sup, job = Supervisor(), make_job({"name": "main", "time_limit": 500}, time_limit=50.0)
    assert sup.review(job, 50.0, lambda n: True) == [Stop(1, "time_limit")]


def test_startup_timeout_signals_a_replica_never_ready() -> None:
    sup = Supervisor()
    job = make_job({"name": "web", "startup_timeout": 30, "grace_period": 4, "readiness_probe": {"exec": "true"}})
    r = one(job)
    r.ready = False
    assert sup.watch(job, r) == [30.0]
    sup.probe_answered(job, r, ProbeAnswered(1, "readiness", False, "connection refused"), 5.0)
    assert sup.review(job, 29.0, lambda n: True) == []
    [d] = sup.review(job, 30.0, lambda n: True)
    assert d.cause == "startup_timeout" and "connection refused" in d.message and d.grace == 4.0
    # its exit is the stop signal's (143): what ended it is said, not only the code
    [end] = sup.attempt_ended(job, r, AttemptEnded(1, 143), 31.0)
    assert isinstance(end, End) and end.message == "exit code 143 (stopped: not ready 30s after start, its startup_timeout)"


def test_a_replica_ready_once_has_no_startup_timeout_even_if_it_turns_unready() -> None:
    sup = Supervisor()
    job = make_job({"name": "web", "startup_timeout": 30, "readiness_probe": {"exec": "true"}})
    r = one(job)
    r.ready = False
    [d] = sup.probe_answered(job, r, ProbeAnswered(1, "readiness", True), 2.0)
    r.ready = False  # then failed its readiness probe
    assert sup.review(job, 31.0, lambda n: True) == []


def test_grace_over_kills_only_what_still_runs() -> None:
    sup, job = Supervisor(), make_job({"name": "main"})
    r = one(job)
    r.kill_at, r.stop_requested_at = 5.0, 1.0
    assert sup.review(job, 4.0, lambda n: True) == []
    assert sup.review(job, 5.0, lambda n: True) == [Kill(1)]
    r.handle = None
    assert sup.review(job, 6.0, lambda n: True) == []


def test_a_waiting_replica_whose_dependency_failed_fails() -> None:
    sup = Supervisor()
    job = make_job({"name": "db"}, {"name": "app", "depends_on": [{"task": "db"}]})
    db, app = job.replicas
    db.state = ReplicaState.FAILED
    app.state, app.handle = ReplicaState.STARTING, None
    [d] = sup.review(job, 1.0, lambda n: True)
    assert isinstance(d, End) and d.replica_id == app.id and d.cause == "dependency_failed"


# -- the transition table ------------------------------------------------------------------
def test_every_move_in_the_table_is_an_allowed_replica_transition() -> None:
    for kind, (sources, to) in MOVES.items():
        for source in sources:
            for new in ([to] if to is not None else [s for s in ReplicaState if s.terminal]):
                assert new in REPLICA_TRANSITIONS[source], (kind.__name__, source, new)


def test_check_refuses_a_decision_for_a_replica_in_the_wrong_state() -> None:
    with pytest.raises(TransitionError):
        check(Relaunch(1, "x"), ReplicaState.RUNNING)
    with pytest.raises(TransitionError):
        check(Restart(1, 1.0, 1, "x"), ReplicaState.SUCCEEDED)
    with pytest.raises(TransitionError):
        check(End(1, ReplicaState.RUNNING, "x", "y"), ReplicaState.STARTING)
    check(Kill(1), ReplicaState.RUNNING)  # moves nothing


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("exit"), st.integers(0, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("probe"), st.sampled_from(["readiness", "liveness"]), st.booleans(), st.just(False)),
    st.tuples(st.just("tick"), st.floats(0, 50), st.booleans(), st.just(False)),
    st.tuples(st.just("stop"), st.just(0), st.just(False), st.just(False)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.sampled_from(["never", "on_failure", "always"]), st.integers(0, 3))
def test_any_event_sequence_yields_only_legal_decisions(events, policy, max_restarts) -> None:
    """Replaying any sequence of events through the supervisor, applying its decisions the
    way the loop does: every decision is legal for the replica's state, restarts never
    exceed the policy's maximum, and a replica corral asked to stop never starts again."""
    sup = Supervisor()
    job = make_job({"name": "main", "restart": {"policy": policy, "max_restarts": max_restarts,
                                                "backoff": {"initial": 1, "factor": 1}},
                    "time_limit": 200, "readiness_probe": {"exec": "true"},
                    "liveness_probe": {"exec": "true", "failure_threshold": 2}})
    r = one(job)
    r.ready = False
    now = 0.0
    for kind, a, b, c in events:
        if kind == "exit":
            decisions = sup.attempt_ended(job, r, AttemptEnded(r.id, None if b else a, lost=b, reason="x",
                                                              node_up=not c), now) if r.handle else []
        elif kind == "probe":
            decisions = sup.probe_answered(job, r, ProbeAnswered(r.id, a, b), now)
        elif kind == "stop":
            decisions = [] if r.state.terminal else [Stop(r.id, "cancel")]
        else:
            now += a
            decisions = sup.review(job, now, lambda n: b)
        for d in decisions:
            check(d, r.state)
            new = target(d)
            if isinstance(d, Restart):
                assert r.stop_requested_at is None, "asked to stop, yet restarted"
                r.restart_at, r.handle = d.at, None
            elif isinstance(d, Relaunch):
                assert r.stop_requested_at is None
                r.restarts, r.attempt, r.handle, r.started_at = r.restarts + 1, r.attempt + 1, {"pid": 2}, now
                new = ReplicaState.RUNNING  # launched at once
            elif isinstance(d, Replace):
                assert r.stop_requested_at is None
                r.restarts, r.handle, r.node = r.restarts + 1, None, None
            elif isinstance(d, Stop):
                r.stop_requested_at, r.stop_cause = now, d.cause
                if r.handle is None:
                    new = ReplicaState.KILLED
            elif isinstance(d, SetReady):
                r.ready = d.ready
            elif isinstance(d, (RequeueJob, End)):
                r.handle = None
            if new is not None:
                r.state = new
            if r.state == ReplicaState.PENDING:  # placed again at once
                r.state, r.node, r.handle, r.started_at = ReplicaState.RUNNING, "n1", {"pid": 3}, now
            assert r.restarts <= max_restarts
        if r.state.terminal:
            break


def test_a_replica_lost_with_nodes_its_engine_ended_is_neither_restarted_nor_requeued() -> None:
    """Slurm ended the job's allocation (its time limit, an scancel): the replicas lost with it
    end, whatever their restart policy, and the job is not requeued as for a lost node."""
    sup, job = Supervisor(), make_job({"name": "main", "restart": ALWAYS})
    job.ended_by = (JobState.CANCELLED, "Slurm ended its allocation (job 7: cancelled)")
    [end] = sup.attempt_ended(job, one(job), AttemptEnded(1, None, lost=True, reason="allocation gone",
                                                           node_up=False), 5.0)
    assert isinstance(end, End) and end.state == ReplicaState.FAILED
    job.ended_by = None  # the same loss with the nodes still the job's: recovered as the policy says
    one(job).state = ReplicaState.RUNNING
    [again] = sup.attempt_ended(job, one(job), AttemptEnded(1, None, lost=True, reason="node died", node_up=False), 5.0)
    assert isinstance(again, Restart)


def test_a_restart_says_what_the_log_said_and_a_service_s_restarts_have_no_cap_shown() -> None:
    sup = Supervisor()
    job = make_job({"name": "main", "restart": {"policy": "always", "max_restarts": 1_000_000}})
    said = "its log says a port it binds is already in use on its node"
    [d] = sup.attempt_ended(job, one(job), AttemptEnded(1, 1, reason=said), 10.0)
    assert isinstance(d, Restart) and d.message.startswith(f"exit code 1 ({said}); restart 1 in 1s")
