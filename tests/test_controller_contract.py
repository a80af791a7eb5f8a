"""The control loop against the executor contract, with a fake executor: late-confirmed
starts, attempts lost while starting, nodes that leave, and events for attempts that are
nobody's any more."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import bearer, submit, wait_for, wait_state
from corral.executors.contract import Kind, Observed
from corral.pool import NodeSpec
from fake_executor import FakeExecutor

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


@pytest.fixture
def fake_server(corral_home: Path, db_url: str) -> Iterator:
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    state = build_state(Settings(home=corral_home, db_url=db_url, poll_interval_s=0.1))
    loop = state.loop
    real = loop.inventory.executors["local"]
    fake = FakeExecutor([NodeSpec(name="gpu-0", gpus=4, gpu_type="H100", cpus=8, memory=64),
                         NodeSpec(name="gpu-1", gpus=4, gpu_type="H100", cpus=8, memory=64)], loop.notify,
                        confirm_later=True)
    loop.inventory.executors["local"] = fake
    real.close()
    loop.inventory.refresh(force=True)
    loop._publish_view()
    with TestClient(create_app(state), headers=bearer(state, "alice")) as client:
        client.fake = fake
        yield client


def _replica(server, job_id: int) -> dict:
    return server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]["replicas"][0]


def test_a_start_confirmed_later_is_running_only_then(fake_server) -> None:
    fake = fake_server.fake
    job = submit(fake_server, "name: late\nresources: {accelerators: H100:1}\nrun: x\n")
    wait_for(lambda: len(fake.started) == 1)
    assert _replica(fake_server, job["id"])["state"] == "STARTING"  # pending until the engine confirms
    key = fake.keys()[0]
    fake.emit(Observed(key, Kind.STARTED, handle={"key": key, "node": "gpu-0"}, gpus=(3,)))
    running = wait_for(lambda: (lambda r: r if r["state"] == "RUNNING" else None)(_replica(fake_server, job["id"])))
    assert running["gpus"] == [3]  # the GPUs the engine bound
    fake.emit(Observed(key, Kind.EXITED, code=0))
    assert wait_state(fake_server, job["id"], "SUCCEEDED")["exit_code"] == 0


def test_an_attempt_lost_while_starting_restarts_under_a_new_key_elsewhere(fake_server) -> None:
    fake = fake_server.fake
    job = submit(fake_server, """
name: flaky
resources: {accelerators: H100:4}
restart: {policy: on_failure, backoff: {initial: 0s}}
run: x
""")
    wait_for(lambda: len(fake.started) == 1)
    first = fake.started[0]
    fake.drop_node(first.node)  # its node leaves before the start is confirmed
    fake.emit(Observed(first.key, Kind.LOST, node=first.node, reason="node left"))
    wait_for(lambda: len(fake.started) == 2)
    second = fake.started[1]
    assert second.key != first.key and second.node != first.node
    fake.emit(Observed(second.key, Kind.STARTED, handle={"key": second.key, "node": second.node}))
    replica = wait_for(lambda: (lambda r: r if r["state"] == "RUNNING" else None)(_replica(fake_server, job["id"])))
    assert replica["restarts"] == 1 and replica["node"] == second.node
    assert fake_server.get("/v1/health").json()["status"] == "ok"
    nodes = {n["name"]: n["state"] for n in fake_server.get("/v1/nodes").json()}
    assert nodes[first.node] == "DOWN"


def test_an_event_for_an_attempt_nobody_owns_is_ended_not_adopted(fake_server) -> None:
    fake = fake_server.fake
    job = submit(fake_server, "name: one\nrun: x\n")
    wait_for(lambda: len(fake.started) == 1)
    stray = {"key": "999.ghost.0.a1", "node": "gpu-0"}
    fake.emit(Observed(stray["key"], Kind.STARTED, handle=stray))
    wait_for(lambda: ("999.ghost.0.a1", 9) in fake.signals)  # never alive twice: killed
    key = fake.keys()[0]
    fake.emit(Observed(key, Kind.STARTED, handle={"key": key, "node": "gpu-0"}))
    fake.emit(Observed(key, Kind.EXITED, code=0))
    wait_state(fake_server, job["id"], "SUCCEEDED")


def test_an_auxiliary_that_failed_before_its_stop_reached_it_fails_the_job(fake_server) -> None:
    """Its exit is reported after the primaries' end asked it to stop, but the stop signal
    found it gone: it failed on its own (a server that could not bind its port), and the job
    fails, as it does when the report comes first; it was not killed by the stop."""
    fake = fake_server.fake
    job = submit(fake_server, """
name: web
execution: parallel
primary_tasks: [client]
---
name: server
run: x
---
name: client
run: x
""")
    wait_for(lambda: len(fake.started) == 2)
    keys = {launch.key.split(".")[1]: launch.key for launch in fake.started}
    for launch in fake.started:
        fake.emit(Observed(launch.key, Kind.STARTED, handle={"key": launch.key, "node": launch.node}))
    wait_for(lambda: all(r["state"] == "RUNNING" for t in fake_server.get(f"/v1/jobs/{job['id']}").json()["tasks"]
                         for r in t["replicas"]))
    fake.ended.add(keys["server"])  # it exited 1; the executor has not reported it yet
    fake.emit(Observed(keys["client"], Kind.EXITED, code=0))
    wait_for(lambda: (keys["server"], 15) in fake.signals)  # the primaries' end stopped it: the signal found it gone
    fake.emit(Observed(keys["server"], Kind.EXITED, code=1))
    done = wait_state(fake_server, job["id"], "FAILED", "SUCCEEDED")
    assert done["state"] == "FAILED", done
    server = next(t for t in done["tasks"] if t["name"] == "server")["replicas"][0]
    assert server["state"] == "FAILED" and server["exit_code"] == 1, server
    assert "auxiliary replica server-0 failed" in (done.get("message") or ""), done
