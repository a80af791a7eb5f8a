"""The autoscaler's decisions on a fake clock and a fake request rate: a direction must be
wanted without interruption for its delay, a burst shorter than that moves nothing, a
change of direction starts the delay afresh, and the bounds hold."""

from __future__ import annotations

from types import SimpleNamespace

from corral.control.autoscaling import Autoscaler
from corral.control.records import JobRec, TaskRec
from corral.spec import load_job
from corral.states import JobState

SERVICE = ("service:\n  readiness_probe: /\n  replica_policy: {min_replicas: 1, max_replicas: 4, "
           "target_qps_per_replica: 10, upscale_delay_seconds: 30, downscale_delay_seconds: 120}\n"
           "  ports: 8080\nrun: x\n")


class _Session:
    def __init__(self) -> None:
        self.statements = 0

    def execute(self, statement) -> None:  # noqa: ANN001 - an SQLAlchemy update
        self.statements += 1


def _world(rate: list[float]):
    spec = load_job(SERVICE).spec.tasks[0].model_dump(mode="json")
    task = TaskRec(1, spec["name"], True, 1, 0, None, 0.1, 0.0, 5.0, 0.0, None, None, spec)
    job = JobRec(7, "web", "ann", False, JobState.RUNNING, 0.0, False, tasks=[task])
    scaled: list[int] = []

    def reconcile(s, job, name, count, now) -> None:  # noqa: ANN001
        job.task(name).num_nodes = count
        scaled.append(count)

    events: list[str] = []
    scaler = Autoscaler(SimpleNamespace(active={7: job}),
                        SimpleNamespace(jobs=[7], balancer=SimpleNamespace(rate=lambda key: rate[0], held=lambda key: 0)),
                        SimpleNamespace(reconcile=reconcile),
                        SimpleNamespace(event=lambda *a, message: events.append(message)))
    return scaler, task, scaled, events


def test_growth_waits_out_the_upscale_delay_and_respects_the_bound() -> None:
    rate = [35.0]  # wants 4 replicas
    scaler, task, scaled, events = _world(rate)
    s = _Session()
    scaler.run(s, 0.0)
    scaler.run(s, 29.0)
    assert scaled == []
    scaler.run(s, 30.0)
    assert scaled == [4] and task.num_nodes == 4 and s.statements == 1
    assert "35.00 requests/s" in events[0] and "1 -> 4 replicas" in events[0]
    rate[0] = 500.0  # would want 50: the bound is 4
    scaler.run(s, 100.0)
    scaler.run(s, 200.0)
    assert scaled == [4]


def test_a_burst_shorter_than_the_delay_moves_nothing() -> None:
    rate = [25.0]
    scaler, task, scaled, _ = _world(rate)
    s = _Session()
    scaler.run(s, 0.0)
    rate[0] = 5.0  # the burst ends before 30 s: back to wanting 1
    scaler.run(s, 20.0)
    rate[0] = 25.0  # wanted again: its delay starts afresh
    scaler.run(s, 25.0)
    scaler.run(s, 50.0)
    assert scaled == []
    scaler.run(s, 55.0)
    assert scaled == [3]


def test_shrinking_waits_out_the_downscale_delay_and_stops_at_the_minimum() -> None:
    rate = [35.0]
    scaler, task, scaled, _ = _world(rate)
    s = _Session()
    scaler.run(s, 0.0)
    scaler.run(s, 30.0)
    rate[0] = 0.0
    scaler.run(s, 40.0)
    scaler.run(s, 159.0)
    assert scaled == [4]
    scaler.run(s, 160.0)
    assert scaled == [4, 1] and task.num_nodes == 1
