"""The pure parts of multi-node service replicas and scale to zero: SkyServe's fields read as
gangs and a zero minimum (and bad ones refused naming the field), the environment a gang
member sees, the supervisor restarting or stopping a gang as a whole, a running job's waiting
gang members grouped into one request, and the autoscaler going to zero and back on a fake
clock (at once from zero; never down while a request is held)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corral.control.autoscaling import Autoscaler, wanted
from corral.control.decisions import End, Restart, Signal, Stop
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.control.scaling import _waiting
from corral.control.supervisor import AttemptEnded, Supervisor
from corral.runtime.environment import ReplicaContext, replica_env
from corral.spec import load_job
from corral.spec.loader import SpecError
from corral.states import JobState, ReplicaState


def service(serve: str, extra: str = "") -> str:
    return f"name: llm\nnum_nodes: 2\nservice:\n  readiness_probe: /health\n{serve}  ports: 8080\n{extra}run: x\n"


# -- the spec -------------------------------------------------------------------------------------
def test_num_nodes_under_service_makes_each_service_replica_a_gang() -> None:
    fixed = load_job(service("  replicas: 3\n")).spec.tasks[0]
    assert (fixed.gang_size, fixed.num_nodes, fixed.min_nodes, fixed.max_nodes) == (2, 6, None, None)
    assert [fixed.heads(r) for r in range(4)] == [True, False, True, False]
    assert fixed.readiness_of(0) is fixed.readiness_probe and fixed.readiness_of(1) is None
    assert [fixed.gang_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    auto = load_job(service("  replica_policy: {min_replicas: 1, max_replicas: 3, target_qps_per_replica: 2}\n"))
    task = auto.spec.tasks[0]
    assert (task.num_nodes, task.min_nodes, task.max_nodes) == (2, 2, 6) and task.autoscale is not None
    single = load_job(service("  replicas: 2\n").replace("num_nodes: 2\n", "")).spec.tasks[0]
    assert (single.gang_size, single.num_nodes) == (1, 2)


def test_corral_s_own_form_scales_to_zero_with_a_hold() -> None:
    task = load_job("ports: {http: 80}\nendpoint: {port: http, hold: 5s}\nnum_nodes: {min: 0, max: 2, initial: 1}\n"
                    "autoscale: {target_qps_per_replica: 1}\nrun: x\n").spec.tasks[0]
    assert (task.num_nodes, task.min_nodes, task.endpoint.hold) == (1, 0, 5.0)


def test_min_replicas_zero_starts_with_one_service_replica_and_may_go_to_zero() -> None:
    task = load_job(service("  replica_policy: {min_replicas: 0, max_replicas: 2, target_qps_per_replica: 1}\n"))\
        .spec.tasks[0]
    assert (task.num_nodes, task.min_nodes, task.max_nodes) == (2, 0, 4)
    again = type(task).model_validate_json(task.model_dump_json())
    assert again == task  # the stored form reads back to itself


@pytest.mark.parametrize("text, words", [
    (service("  replica_policy: {min_replicas: 0, max_replicas: 2}\n"), "needs target_qps_per_replica"),
    (service("  replica_policy: {min_replicas: 0, max_replicas: 0, target_qps_per_replica: 1}\n"),
     "max_replicas must be at least 1"),
    (service("  replicas: 0\n"), "service.replicas is a whole number"),
    (service("  replicas: 2\n").replace("num_nodes: 2", "num_nodes: 0"), "num_nodes of a service"),
    ("num_nodes: {min: 0, max: 2, initial: 1}\nrun: x\n", "scale to zero"),
    ("num_nodes: 3\ngang_size: 2\nrun: x\n", "not a multiple of 2"),
    ("ports: {http: 80}\nendpoint: {port: http, hold: 5s}\nrun: x\n", "endpoint.hold"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(text: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_job(text)
    assert words in str(caught.value)


# -- the environment ------------------------------------------------------------------------------
def test_a_gang_member_sees_its_gang_and_keeps_its_task_wide_name() -> None:
    ips = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
    ctx = ReplicaContext(job_id=5, job_name="llm", is_group=False, task="serve", rank=3, num_replicas=4, node="n3",
                         node_ips=ips, addr=ips[3], gpus=(0,), gpus_per_replica=1, cpus=1, master_port=29500,
                         checkpoint_dir="/c", restart_count=0, user="ann", master_addr=ips[0],
                         task_nodes=("n0", "n1", "n2", "n3"), job_nodes=("n0", "n1", "n2", "n3"), gang_size=2)
    env = replica_env({}, ctx)
    assert env["SKYPILOT_NODE_RANK"] == env["RANK"] == "1" and env["SKYPILOT_NUM_NODES"] == env["WORLD_SIZE"] == "2"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.3\n10.0.0.4" and env["MASTER_ADDR"] == "10.0.0.3"
    assert env["SLURM_PROCID"] == "1" and env["SLURM_JOB_NODELIST"] == "n[2-3]"
    assert (env["CORRAL_REPLICA"], env["CORRAL_NUM_REPLICAS"], env["CORRAL_HOSTNAME"]) == ("3", "4", "serve-3.llm")
    assert env["CORRAL_NODE_IPS"] == "\n".join(ips)
    assert (env["CORRAL_GANG"], env["CORRAL_GANG_RANK"], env["CORRAL_GANG_HEAD"]) == ("1", "1", "serve-2.llm")
    plain = replica_env({}, ReplicaContext(**{**ctx.__dict__, "gang_size": 1}))
    assert plain["SKYPILOT_NODE_RANK"] == "3" and plain["MASTER_ADDR"] == ips[0] and "CORRAL_GANG" not in plain


# -- the supervisor -------------------------------------------------------------------------------
def gang_job(restart: dict | None = None) -> JobRec:
    spec = load_job(service("  replicas: 2\n", f"restart: {restart}\n" if restart else "")).spec.tasks[0]
    task = TaskRec(1, "llm", True, 4, 1, None, 0.1, 0.0, 5.0, 0.0, None, None, spec.model_dump(mode="json"))
    job = JobRec(1, "llm", "ann", False, JobState.RUNNING, 0.0, False, tasks=[task])
    for rank in range(4):
        job.replicas.append(ReplicaRec(rank + 1, 1, "llm", rank, ReplicaState.RUNNING, node="n0", handle={"pid": 1},
                                       started_at=0.0, attempt=1, ready=True))
    return job


def test_a_dead_worker_restarts_its_whole_gang_and_only_it() -> None:
    sup = Supervisor()
    job = gang_job({"policy": "on_failure", "backoff": {"initial": 2}})
    worker = job.replicas[3]
    decisions = sup.attempt_ended(job, worker, AttemptEnded(4, code=None, lost=True, reason="killed"), 10.0)
    restart, follow = decisions
    assert isinstance(restart, Restart) and restart.replica_id == 4 and restart.at == 12.0
    assert isinstance(follow, Signal) and follow.replica_id == 3 and follow.cause == "gang_restart"
    # the head exits from that signal (143): it restarts with its gang whatever the policy reads
    worker.state = ReplicaState.RESTARTING
    head = job.replicas[2]
    head.kill_at = 15.0
    [again] = sup.attempt_ended(job, head, AttemptEnded(3, 143), 10.5)
    assert isinstance(again, Restart) and again.at == 12.0 and "gang" in again.message


def test_a_gang_member_that_does_not_restart_stops_its_gang() -> None:
    sup, job = Supervisor(), gang_job({"policy": "never"})
    decisions = sup.attempt_ended(job, job.replicas[0], AttemptEnded(1, 1), 10.0)
    assert isinstance(decisions[0], End) and decisions[0].state == ReplicaState.FAILED
    assert decisions[1:] == [Stop(2, "gang_ended")]


def test_a_member_asked_to_stop_takes_no_peer_with_it() -> None:
    sup, job = Supervisor(), gang_job({"policy": "always"})
    job.replicas[1].stop_requested_at = 5.0
    [end] = sup.attempt_ended(job, job.replicas[1], AttemptEnded(2, 143), 10.0)
    assert isinstance(end, End) and end.state == ReplicaState.KILLED


def test_only_heads_are_probed_so_a_worker_never_times_out_its_start() -> None:
    sup, job = Supervisor(), gang_job()
    for r in job.replicas:
        r.ready = False
    stops = [d for d in sup.review(job, 10_000.0, lambda node: True) if isinstance(d, Signal)]
    assert sorted(d.replica_id for d in stops) == [1, 3]  # the heads (ranks 0, 2): startup_timeout


# -- growth requests --------------------------------------------------------------------------------
def test_waiting_gang_members_are_one_request_and_single_replicas_their_own() -> None:
    job = gang_job()
    for rank in range(4, 8):
        job.replicas.append(ReplicaRec(rank + 1, 1, "llm", rank, ReplicaState.PENDING))
    job.replicas[1].state = ReplicaState.PENDING  # a worker replaced on its own (its node went away)
    groups = [(task, [r.rank for r in members]) for task, members in _waiting(job, {"llm"})]
    assert groups == [("llm", [1]), ("llm", [4, 5]), ("llm", [6, 7])]


# -- the autoscaler on a fake clock ------------------------------------------------------------------
class _Session:
    def execute(self, statement) -> None:  # noqa: ANN001 - an SQLAlchemy update
        pass


def zero_world(rate: list[float], held: list[int]):
    spec = load_job(service("  replica_policy: {min_replicas: 0, max_replicas: 3, target_qps_per_replica: 2, "
                            "upscale_delay_seconds: 30, downscale_delay_seconds: 60}\n")).spec.tasks[0]
    task = TaskRec(1, "llm", True, 2, 1, None, 0.1, 0.0, 5.0, 0.0, None, None, spec.model_dump(mode="json"))
    job = JobRec(7, "llm", "ann", False, JobState.RUNNING, 0.0, False, tasks=[task])
    scaled: list[int] = []

    def reconcile(s, job, name, count, now) -> None:  # noqa: ANN001
        job.task(name).num_nodes = count
        scaled.append(count)

    events: list[str] = []
    balancer = SimpleNamespace(rate=lambda key: rate[0], held=lambda key: held[0])
    scaler = Autoscaler(SimpleNamespace(active={7: job}), SimpleNamespace(jobs=[7], balancer=balancer),
                        SimpleNamespace(reconcile=reconcile),
                        SimpleNamespace(event=lambda *a, message: events.append(message)))
    return scaler, scaled, events


def test_no_requests_for_the_downscale_delay_goes_to_zero_and_a_request_comes_back_at_once() -> None:
    rate, held = [0.0], [0]
    scaler, scaled, events = zero_world(rate, held)
    s = _Session()
    scaler.run(s, 0.0)
    scaler.run(s, 59.0)
    assert scaled == []
    scaler.run(s, 60.0)
    assert scaled == [0] and "scaled to zero" in events[-1] and "GPUs freed" in events[-1]
    rate[0], held[0] = 1 / 60, 1  # one request, held: back at once, no upscale delay from zero
    scaler.run(s, 61.0)
    assert scaled == [0, 2] and "while at zero" in events[-1] and "1 service replica(s) of 2" in events[-1]


def test_a_held_request_keeps_a_gang_wanted_after_its_rate_has_faded() -> None:
    rate, held = [0.0], [1]
    scaler, scaled, _ = zero_world(rate, held)
    s = _Session()
    for now in (0.0, 100.0, 1000.0):
        scaler.run(s, now)
    assert scaled == []  # still one gang: the held request waits for it
    held[0] = 0
    scaler.run(s, 1001.0)
    scaler.run(s, 1061.0)
    assert scaled == [0]


def test_what_a_rate_wants_counts_whole_gangs_within_bounds() -> None:
    spec = load_job(service("  replica_policy: {min_replicas: 0, max_replicas: 3, target_qps_per_replica: 2}\n"))\
        .spec.tasks[0]
    assert [wanted(spec, 2, r) for r in (0.0, 0.01, 2.0, 2.1, 5.9, 100.0)] == [0, 2, 2, 4, 6, 6]
    assert wanted(spec, 0, 0.0, held=2) == 2
