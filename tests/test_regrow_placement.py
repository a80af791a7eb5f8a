"""A replica placed again while its job runs (a scale up, a replacement) goes where the task
allows, as when the job started: its ``constraint`` (node features) and ``nodelist`` hold,
with a real server, real processes and a declared pool where a node outside them has room."""

from __future__ import annotations


import pytest

from conftest import submit, wait_for, wait_state

SITE = """
nodes:
  - {name: fast, gpus: 4, gpu_type: H100, cpus: 8, memory: 64, labels: {ib: "yes"}}
  - {name: slow, gpus: 4, gpu_type: H100, cpus: 8, memory: 64}
  - {name: spare, gpus: 4, gpu_type: H100, cpus: 8, memory: 64, labels: {ib: "yes"}}
"""


@pytest.fixture
def site_config() -> str:
    return SITE


def _nodes(server, job_id: int) -> list[tuple[str, str | None]]:
    task = server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]
    return sorted((r["state"], r["node"]) for r in task["replicas"])


@pytest.mark.parametrize("where", ["constraint: ib", "nodelist: [fast, spare]"])
def test_a_scale_up_keeps_to_the_task_s_nodes(server, where: str) -> None:
    job = submit(server, f"name: grow\nnum_nodes: {{min: 1, max: 3, initial: 1}}\n{where}\n"
                         "resources: {accelerators: H100:4}\nrun: sleep 60\n")
    wait_state(server, job["id"], "RUNNING")
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "grow", "replicas": 3}).status_code == 200
    # two nodes have the feature (and are listed): the third replica has nowhere to go, though
    # the node without it is idle
    wait_for(lambda: [s for s, _ in _nodes(server, job["id"])].count("RUNNING") == 2, timeout=30)
    placed = _nodes(server, job["id"])
    assert sorted(n for s, n in placed if s == "RUNNING") == ["fast", "spare"]
    assert ("PENDING", None) in placed
    # and says why it waits
    wait_for(lambda: any((r["reason"] or "").startswith("waiting for a place (reason ")
                         for r in server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]), timeout=15)
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED", timeout=30)
