"""The server's run-time predictions (control/runtimes.py) on a fake clock: learned only from
committed ends and once each, shown whether or not the policy plans with them, carried to the
scheduler only when it does, kept from start to end, and recomputed only for users whose
history changed."""

from __future__ import annotations

import math

import pytest

from corral.control.journal import Journal
from corral.control.records import JobRec, TaskRec
from corral.control.runtimes import RunTimes
from corral.spec import load_job
from corral.states import JobState
from corral.store.tables import Job

SPEC = load_job("name: t\nresources: {accelerators: H100:2}\nrun: echo\n").spec.tasks[0].model_dump(mode="json")


def rec(job_id: int, user: str = "ann", name: str = "train", gpus: int = 2, limit: float | None = 36000.0,
        started_at: float | None = None) -> JobRec:
    task = TaskRec(job_id * 10, "t", True, 1, gpus, "H100", 1.0, 0.0, 5.0, 0.0, None, None, SPEC)
    return JobRec(job_id, name, user, False, JobState.PENDING, 0.0, False, tasks=[task], time_limit=limit,
                  started_at=started_at)


def ran(times: RunTimes, job: JobRec, started: float, ended: float, state: JobState = JobState.SUCCEEDED) -> None:
    job.started_at = started
    times.ended(job, state, ended)


def test_an_end_is_learned_once_its_cycle_is_committed_and_only_once() -> None:
    times = RunTimes(use=True)
    done = rec(1)
    ran(times, done, 1000.0, 1600.0)  # ran 600 s
    waiting = rec(2)
    assert times.predict(waiting) is None  # not committed yet: nothing learned
    times.lost()  # the cycle's writes were lost: the end never happened
    times.committed()
    assert times.predict(waiting) is None
    ran(times, done, 1000.0, 1600.0)  # the retried cycle ends it again
    times.committed()
    assert times.predict(waiting) == pytest.approx(600.0)
    ran(times, done, 1000.0, 50_000.0)  # the same job's end, journalled again by a retried write
    times.committed()
    times.committed()
    assert times.predict(waiting) == pytest.approx(600.0)  # still one run of 600 s


def test_failed_and_cancelled_runs_teach_nothing() -> None:
    times = RunTimes(use=True)
    ran(times, rec(1), 0.0, 5.0, JobState.FAILED)
    ran(times, rec(2), 0.0, 7.0, JobState.CANCELLED)
    times.committed()
    assert times.predict(rec(3)) is None
    ran(times, rec(4), 0.0, 7200.0, JobState.TIMEOUT)  # met its limit: that is what it takes
    times.committed()
    assert times.predict(rec(5)) == pytest.approx(7200.0)


def test_prediction_is_capped_by_the_limit_and_falls_back_to_the_users_other_jobs() -> None:
    times = RunTimes(use=True)
    for i, run in enumerate((100.0, 400.0)):
        ran(times, rec(i + 1), 0.0, run)
    times.committed()
    assert math.isclose(times.predict(rec(9)), 200.0)  # geometric mean of the same name and GPUs
    assert times.predict(rec(9, limit=150.0)) == 150.0  # never past its own limit
    assert math.isclose(times.predict(rec(9, name="other", gpus=8)), 200.0)  # any of ann's jobs
    assert times.predict(rec(9, user="bob")) is None


def test_the_scheduler_plans_with_predictions_only_when_the_policy_says_so() -> None:
    for use in (True, False):
        times = RunTimes(use=use)
        ran(times, rec(1), 0.0, 900.0)
        times.committed()
        waiting, fresh = rec(2), rec(3, user="bob")
        requests = times.requests([waiting, fresh])
        assert times.predictions == {2: pytest.approx(900.0)}  # shown either way; bob has no history
        assert requests[1] is fresh.request
        if use:
            assert requests[0].expected == pytest.approx(900.0) and requests[0].run_s == requests[0].expected
        else:
            assert requests[0] is waiting.request and requests[0].run_s == 36000.0


def test_predictions_are_kept_until_the_users_history_changes() -> None:
    times = RunTimes(use=True)
    ran(times, rec(1), 0.0, 900.0)
    ran(times, rec(2, user="bob"), 0.0, 60.0)
    times.committed()
    ann, bob = rec(3), rec(4, user="bob")
    first = times.requests([ann, bob])
    again = times.requests([ann, bob])
    assert again[0] is first[0] and again[1] is first[1] and times.rescored == []
    ran(times, rec(5, user="bob"), 0.0, 240.0)  # bob's history changes, ann's does not
    times.committed()
    third = times.requests([ann, bob])
    assert third[0] is first[0]
    assert third[1] is not first[1] and math.isclose(third[1].expected, 120.0)
    assert times.rescored == [4]  # its priority is computed again with the new prediction
    times.requests([bob])  # ann's job left the queue: it is neither cached nor shown
    assert set(times.predictions) == {4}


def test_a_started_job_keeps_its_prediction_and_is_planned_to_its_limit_once_past_it() -> None:
    times = RunTimes(use=True)
    ran(times, rec(1), 0.0, 600.0)
    times.committed()
    job = rec(2, limit=3600.0)
    times.requests([job])
    journal = Journal()
    times.started(job, journal)
    assert journal._rows[Job][2] == {"predicted_run_s": pytest.approx(600.0)}
    job.started_at = 10_000.0
    assert times.planned_end(job, 13_600.0, now=10_100.0) == (pytest.approx(10_600.0), 13_600.0)
    assert times.planned_end(job, 13_600.0, now=10_601.0) == (13_600.0, None)  # outlived it
    ran(times, rec(3), 0.0, 5.0)  # history moving on does not change what it started with
    times.committed()
    assert times.planned_end(job, 13_600.0, now=10_100.0) == (pytest.approx(10_600.0), 13_600.0)
    times.ended(job, JobState.SUCCEEDED, 10_650.0)
    assert job.id not in times.at_start
    off = RunTimes(use=False)
    off.at_start[2] = 600.0
    assert off.planned_end(job, 13_600.0, now=10_100.0) == (13_600.0, None)  # the limit, as Slurm plans


def test_a_job_without_history_starts_with_none_and_a_pipeline_stage_keeps_its_first() -> None:
    times = RunTimes(use=True)
    journal = Journal()
    job = rec(1)
    times.requests([job])
    times.started(job, journal)
    assert journal._rows[Job][1] == {"predicted_run_s": None} and 1 not in times.at_start
    ran(times, rec(2), 0.0, 300.0)
    times.committed()
    stage = rec(3, started_at=50.0)  # a pipeline waiting for its next stage: it started already
    times.at_start[3] = 1200.0
    times.requests([stage])
    assert times.predictions == {}
    journal = Journal()
    times.started(stage, journal)
    assert journal._rows[Job] == {} and times.at_start[3] == 1200.0
