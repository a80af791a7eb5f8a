"""What the peers file says of each replica (``Discovery.publish_job``), with records and a
recording executor: readiness is claimed only for a replica that runs, so a member of a
multi-node service replica waiting to be placed again is never listed as ready."""

from __future__ import annotations

import json
from types import SimpleNamespace

from corral.control.discovery import Discovery
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.executors.registry import DEFAULT
from corral.spec import load_job
from corral.states import JobState, ReplicaState

SERVICE = "service:\n  readiness_probe: /\n  replicas: 1\n  ports: 8080\nnum_nodes: 2\nrun: x\n"


def _published(replicas: list[ReplicaRec]) -> dict:
    spec = load_job(SERVICE).spec.tasks[0].model_dump(mode="json")
    task = TaskRec(1, spec["name"], True, 2, 0, None, 0.1, 0.0, 5.0, 0.0, None, None, spec)
    job = JobRec(7, "web", "ann", False, JobState.RUNNING, 0.0, False, tasks=[task], replicas=replicas)
    written: list[str] = []
    executor = SimpleNamespace(publish=lambda job_id, nodes, hosts, text: written.append(text))
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
