"""Declared ports through the control loop, with a fake executor whose nodes have addresses:
two replicas of one port are placed on two addresses, a job that could never hold its ports
is refused with a sentence, and a port an executor could not honour is said per replica (its
event in ``corral events``, ``CORRAL_PORT_*`` and the peers file)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import bearer, submit, wait_for
from corral.executors.contract import Binding, Kind, Observed
from corral.pool import NodeSpec
from fake_executor import FakeExecutor


class PortsExecutor(FakeExecutor):
    """Nodes with addresses; ports listed in ``busy`` are in use on every node (a process
    corral did not start holds them), so bind gives another and says why."""

    busy: set[int] = set()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peers: dict[int, dict] = {}

    def bind(self, job_id, replica_id, node, ports, previous) -> Binding:
        addr = next(n.address for n in self.nodes() if n.name == node)
        chosen = {name: (40000 + replica_id if port in self.busy else port) for name, port in ports.items()}
        moved = "; ".join(f"{port} is in use on {node}" for port in ports.values() if port in self.busy)
        return Binding(addr, chosen, moved)

    def publish(self, job_id, nodes, hosts, peers) -> None:
        self.peers[job_id] = json.loads(peers)


def _server(corral_home: Path, db_url: str, addresses: list[str]) -> Iterator:
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    state = build_state(Settings(home=corral_home, db_url=db_url, poll_interval_s=0.1))
    loop = state.loop
    real = loop.inventory.executors["local"]
    fake = PortsExecutor([NodeSpec(name=f"gpu-{i}", gpus=4, gpu_type="H100", cpus=8, memory=64, address=addr)
                          for i, addr in enumerate(addresses)], loop.notify)
    loop.inventory.executors["local"] = fake
    real.close()
    loop.inventory.refresh(force=True)
    loop._publish_view()
    with TestClient(create_app(state), headers=bearer(state, "alice")) as client:
        client.fake = fake
        yield client


@pytest.fixture
def two_addresses(corral_home: Path, db_url: str) -> Iterator:
    yield from _server(corral_home, db_url, ["10.0.0.1", "10.0.0.2"])


@pytest.fixture
def one_address(corral_home: Path, db_url: str) -> Iterator:
    yield from _server(corral_home, db_url, ["loopback", "loopback"])


SERVERS = "name: web\nnum_nodes: 2\nresources: {accelerators: H100:1, ports: {http: 8000}}\nrun: x\n"


def test_two_replicas_of_one_port_are_placed_on_two_addresses(two_addresses) -> None:
    fake = two_addresses.fake
    submit(two_addresses, SERVERS)
    wait_for(lambda: len(fake.started) == 2)
    assert {launch.node for launch in fake.started} == {"gpu-0", "gpu-1"}  # best fit alone packs one node
    assert all(launch.env["CORRAL_PORT_HTTP"] == "8000" for launch in fake.started)
    assert all("CORRAL_PORT_HTTP_DECLARED" not in launch.env for launch in fake.started)


def test_a_job_whose_port_no_two_addresses_can_hold_is_refused_with_a_sentence(one_address) -> None:
    response = one_address.post("/v1/jobs", json={"yaml": SERVERS})
    assert response.status_code in (400, 409, 422), response.text
    assert "2 replicas declare port 8000" in response.text and "1 address" in response.text, response.text


def test_a_port_the_executor_could_not_honour_is_said_per_replica(two_addresses) -> None:
    fake = two_addresses.fake
    fake.busy = {8000}
    job = submit(two_addresses, "name: moved\nresources: {accelerators: H100:1, ports: {http: 8000}}\nrun: x\n")
    wait_for(lambda: len(fake.started) == 1)
    launch = fake.started[0]
    assert launch.env["CORRAL_PORT_HTTP_DECLARED"] == "8000"
    bound = int(launch.env["CORRAL_PORT_HTTP"])
    assert bound != 8000
    fake.emit(Observed(launch.key, Kind.STARTED, handle={"key": launch.key}))
    peers = wait_for(lambda: fake.peers.get(job["id"]))
    replica = peers["tasks"]["moved"]["replicas"][0]
    assert replica["ports"] == {"http": bound}
    assert replica["moved_ports"] == {"http": {"declared": 8000, "bound": bound}}
    assert replica["endpoints"]["http"].endswith(f":{bound}")
    events = two_addresses.get(f"/v1/jobs/{job['id']}/events").json()
    moved = [e for e in events if e["cause"] == "port-moved"]
    assert len(moved) == 1 and moved[0]["subject"] == "moved-0", events
    assert f"http 8000 → {bound}" in moved[0]["message"] and "8000 is in use on" in moved[0]["message"]
