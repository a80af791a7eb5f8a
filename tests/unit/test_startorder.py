"""Start ordering (depends_on) and restart policy decisions, as pure functions."""

from __future__ import annotations

from corral.control import startorder
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.spec.service import Backoff, RestartPolicy
from corral.states import JobState, ReplicaState

S = ReplicaState


def group(deps: list[dict], reward_replicas: int = 2) -> JobRec:
    job = JobRec(1, "g", "u", True, JobState.STARTING, 0.0, False)
    specs = {"reward": {"name": "reward", "num_nodes": reward_replicas},
             "trainer": {"name": "trainer", "depends_on": deps}}
    for i, (name, spec) in enumerate(specs.items()):
        job.tasks.append(TaskRec(i, name, name == "trainer", spec.get("num_nodes", 1), 0, None, 0.1, 0, 10, 0, None,
                                 None, spec))
    rid = 0
    for task in job.tasks:
        for rank in range(task.num_nodes):
            rid += 1
            job.replicas.append(ReplicaRec(rid, 1, task.name, rank, S.STARTING))
    return job


def set_state(job: JobRec, task: str, state: ReplicaState, ready: bool = False, pid: int | None = 1) -> None:
    for r in job.replicas_of(task):
        r.state, r.ready, r.pid = state, ready, pid


def labels(replicas) -> list[str]:
    return [r.label for r in replicas]


def test_ready_condition_waits_for_every_replica_to_be_ready() -> None:
    job = group([{"task": "reward", "condition": "ready"}])
    assert labels(startorder.launchable(job)) == ["reward-0", "reward-1"]
    set_state(job, "reward", S.RUNNING, ready=False)
    assert startorder.launchable(job) == []  # running is not ready
    assert startorder.unmet(job, "trainer") == ["reward ready"]
    job.replicas[0].ready = True
    assert startorder.launchable(job) == []  # one of two
    job.replicas[1].ready = True
    assert labels(startorder.launchable(job)) == ["trainer-0"]


def test_started_and_succeeded_conditions() -> None:
    job = group([{"task": "reward", "condition": "started"}])
    set_state(job, "reward", S.RUNNING)
    assert labels(startorder.launchable(job)) == ["trainer-0"]
    job = group([{"task": "reward", "condition": "succeeded"}])
    set_state(job, "reward", S.RUNNING)
    assert startorder.launchable(job) == []
    set_state(job, "reward", S.SUCCEEDED)
    assert labels(startorder.launchable(job)) == ["trainer-0"]


def test_dependency_that_ended_badly_blocks_forever_unless_restarting() -> None:
    job = group([{"task": "reward", "condition": "ready"}])
    set_state(job, "reward", S.RESTARTING)
    assert startorder.blocked_forever(job) == []
    job.replicas[1].state = S.FAILED
    (blocked,) = startorder.blocked_forever(job)
    assert blocked[0].label == "trainer-0" and "reward" in blocked[1]


def test_a_restarting_replica_is_not_gated_again() -> None:
    job = group([{"task": "reward", "condition": "ready"}])
    set_state(job, "reward", S.RUNNING, ready=False)
    trainer = job.replicas_of("trainer")[0]
    trainer.restarts = 1
    assert labels(startorder.launchable(job)) == ["trainer-0"]


def test_restart_policy_decisions_and_backoff() -> None:
    never = RestartPolicy()
    assert not never.should_restart(1, 0)
    on_failure = RestartPolicy(policy="on_failure", max_restarts=2)
    assert on_failure.should_restart(1, 0) and on_failure.should_restart(None, 1)
    assert not on_failure.should_restart(0, 0) and not on_failure.should_restart(1, 2)
    filtered = RestartPolicy(policy="on_failure", exit_codes=[137])
    assert filtered.should_restart(137, 0) and not filtered.should_restart(1, 0)
    always = RestartPolicy(policy="always", max_restarts=1)
    assert always.should_restart(0, 0) and not always.should_restart(0, 1)
    backoff = Backoff(initial=1, max=5, factor=2)
    assert [backoff.delay(n) for n in range(5)] == [1, 2, 4, 5, 5]
