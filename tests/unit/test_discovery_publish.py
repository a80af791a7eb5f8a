"""What the peers file says of each replica (``Discovery.publish_job``), with records and a
recording executor: readiness is claimed only for a replica that runs, so a member of a
multi-node service replica waiting to be placed again is never listed as ready. A namesake's
replicas are named under its domain in both files and in their environment, and keep the job's
name as an alias in its own hosts file."""

from __future__ import annotations

import json
from types import SimpleNamespace

from corral.control.discovery import Discovery
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.executors.registry import DEFAULT
from corral.spec import load_job
from corral.states import JobState, ReplicaState

SERVICE = "service:\n  readiness_probe: /\n  replicas: 1\n  ports: 8080\nnum_nodes: 2\nrun: x\n"


def _published(replicas: list[ReplicaRec], domain: str = "", hosts: list[str] | None = None) -> dict:
    spec = load_job(SERVICE).spec.tasks[0].model_dump(mode="json")
    task = TaskRec(1, spec["name"], True, 2, 0, None, 0.1, 0.0, 5.0, 0.0, None, None, spec)
    job = JobRec(7, "web", "ann", False, JobState.RUNNING, 0.0, False, tasks=[task], replicas=replicas,
                 domain=domain)
    written: list[str] = []

    def publish(job_id: int, nodes: set[str], hosts_text: str, text: str) -> None:
        written.append(text)
        if hosts is not None:
            hosts.append(hosts_text)
    executor = SimpleNamespace(publish=publish)
    book = SimpleNamespace(publish=set(), active={7: job})
    inventory = SimpleNamespace(executors={DEFAULT: executor}, infra_of_node=lambda node: DEFAULT)
    Discovery(book, inventory, SimpleNamespace(track=lambda job_id: None)).publish_job(job, 100.0)
    return json.loads(written[-1])


def test_only_a_running_replica_is_ready_in_the_peers_file() -> None:
    name = load_job(SERVICE).spec.tasks[0].name
    head = ReplicaRec(1, 7, name, 0, ReplicaState.RUNNING, node="n0", addr="127.0.0.2", ready=True)
    # a member whose node was lost: pending again, its old readiness not yet cleared
    member = ReplicaRec(2, 7, name, 1, ReplicaState.PENDING, node=None, addr=None, ready=True)
    peers = _published([head, member])
    listed = {r["rank"]: r for r in peers["tasks"][name]["replicas"]}
    assert listed[0]["ready"] is True
    assert listed[1]["ready"] is False and listed[1]["node"] is None


def test_a_namesake_s_replicas_are_named_under_its_domain_and_answer_to_the_job_s_name_in_its_own_file() -> None:
    from corral.runtime.environment import ReplicaContext, replica_env

    name = load_job(SERVICE).spec.tasks[0].name
    replicas = [ReplicaRec(i + 1, 7, name, i, ReplicaState.RUNNING, node="n0", addr=f"127.0.0.{i + 2}")
                for i in range(2)]
    hosts: list[str] = []
    peers = _published(replicas, domain="web-7", hosts=hosts)
    assert peers["job"] == "web" and peers["domain"] == "web-7"
    assert [r["hostname"] for r in peers["tasks"][name]["replicas"]] == [f"{name}-0.web-7", f"{name}-1.web-7"]
    lines = [line for line in hosts[-1].splitlines() if not line.startswith("#")]
    assert lines == [f"127.0.0.{i + 2}\t{name}-{i}.web-7 {name}-{i}.web {name}-{i}" for i in range(2)]
    plain: list[str] = []  # a job under its own name: no alias, as before
    assert _published(replicas, hosts=plain)["domain"] == "web"
    assert f"127.0.0.2\t{name}-0.web {name}-0\n" in plain[-1] and "web-7" not in plain[-1]
    ctx = ReplicaContext(job_id=7, job_name="web", is_group=False, task=name, rank=1, num_replicas=2, node="n0",
                         node_ips=("127.0.0.2", "127.0.0.3"), addr="127.0.0.3", gpus=(), gpus_per_replica=0, cpus=1,
                         master_port=1234, checkpoint_dir="/c", restart_count=0, user="ann", master_addr="127.0.0.2",
                         gang_size=2, domain="web-7")
    env = replica_env({}, ctx)
    assert env["CORRAL_HOSTNAME"] == f"{name}-1.web-7" and env["CORRAL_JOB_DOMAIN"] == "web-7"
    assert env["CORRAL_GANG_HEAD"] == f"{name}-0.web-7" and env["MASTER_ADDR"] == "127.0.0.2"
    assert env["CORRAL_JOB_NAME"] == env["SLURM_JOB_NAME"] == "web"  # the job keeps its name
