"""Multi-node service replicas and scale to zero, on a real in-process server with real
processes: SkyServe's ``num_nodes: 2`` under ``service:`` makes each service replica a gang of
two replicas (its own ranks, IPs and MASTER_ADDR; only the head listens), the endpoint
balances over ready heads, ``corral scale`` moves whole gangs (placed all or none), a killed
worker restarts its gang; ``min_replicas: 0`` goes to zero without requests, and a request
then is held and brings a replica back, or is answered 503 with the reason when none can
start in time (the GPUs are taken)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import submit, wait_for, wait_state

GANG_SERVER = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
out = os.environ["ENV_DIR"]
keys = [k for k in os.environ if k.startswith(("SKYPILOT_", "CORRAL_", "SLURM_")) or k in ("MASTER_ADDR", "RANK", "WORLD_SIZE")]
with open(f"{out}/env-{os.environ['CORRAL_REPLICA']}-{os.environ['CORRAL_RESTART_COUNT']}.json", "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
if os.environ["SKYPILOT_NODE_RANK"] != "0":  # a worker: prints what it sees and waits
    print("worker", os.environ["SKYPILOT_NODE_RANK"], "of", os.environ["SKYPILOT_NODE_IPS"].split(), flush=True)
    time.sleep(3600)
    sys.exit(0)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["CORRAL_REPLICA"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ThreadingHTTPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_SERVICE"])), H).serve_forever()
"""


def get(endpoint: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{endpoint}/", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError as exc:  # nothing listens: no HTTP status at all
        return 0, str(exc.reason)


def task_of(server, job_id: int) -> dict:
    return server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]


def live(server, job_id: int) -> dict[int, dict]:
    """The task's replicas that belong to it now (not those retired by a scale-down), by rank."""
    task = task_of(server, job_id)
    return {r["rank"]: r for r in task["replicas"] if r["rank"] < task["num_nodes"]}


def env_of(env_dir: Path, rank: int, restart: int = 0) -> dict[str, str]:
    path = env_dir / f"env-{rank}-{restart}.json"
    wait_for(path.exists, timeout=20)
    return json.loads(path.read_text())


def service_yaml(tmp_path: Path, serve: str, extra: str = "") -> str:
    (tmp_path / "serve.py").write_text(GANG_SERVER)
    env_dir = tmp_path / "envs"
    env_dir.mkdir(exist_ok=True)
    return f"""
name: llm
num_nodes: 2
resources: {{accelerators: H100:1}}
service:
{serve}
  ports: 8080
envs: {{ENV_DIR: "{env_dir}"}}
{extra}
run: exec {sys.executable} {tmp_path / 'serve.py'}
"""


def test_a_multi_node_service_replica(server, tmp_path: Path) -> None:
    job = submit(server, service_yaml(tmp_path, """  readiness_probe: /
  replica_policy: {min_replicas: 2, max_replicas: 3}""", "restart: {policy: on_failure, backoff: {initial: 0.5}}"))
    job_id, env_dir = job["id"], tmp_path / "envs"
    wait_state(server, job_id, "RUNNING")
    task = task_of(server, job_id)
    assert task["num_nodes"] == 4 and (task["min_nodes"], task["max_nodes"]) == (4, 6)
    assert "2 service replica(s), each a gang of 2" in task["scale"]
    endpoint = wait_for(lambda: task_of(server, job_id)["endpoint"])
    wait_for(lambda: all(r["ready"] for r in live(server, job_id).values()), timeout=30)
    addr = {rank: r["addr"] for rank, r in live(server, job_id).items()}
    assert len(set(addr.values())) == 4

    # each gang: its own ranks, its own nodes' IPs only, its own head as MASTER_ADDR
    for rank in range(4):
        env = env_of(env_dir, rank)
        head = rank - rank % 2
        assert env["SKYPILOT_NODE_RANK"] == env["RANK"] == str(rank % 2)
        assert env["SKYPILOT_NUM_NODES"] == env["WORLD_SIZE"] == "2"
        assert env["SKYPILOT_NODE_IPS"].split("\n") == [addr[head], addr[head + 1]]
        assert env["MASTER_ADDR"] == addr[head]
        assert env["CORRAL_GANG"] == str(rank // 2) and env["CORRAL_GANG_HEAD"] == f"llm-{head}.llm"
        assert env["CORRAL_REPLICA"] == str(rank) and env["CORRAL_HOSTNAME"] == f"llm-{rank}.llm"
        assert env["CORRAL_NUM_REPLICAS"] == "4"  # corral's own names stay the task's
        assert env["SLURM_PROCID"] == str(rank % 2) and env["SLURM_NTASKS"] == "2"

    peers = json.loads(Path(env_of(env_dir, 0)["CORRAL_PEERS_FILE"]).read_text())
    assert [r["gang"] for r in peers["tasks"]["llm"]["replicas"]] == [0, 0, 1, 1]

    # the endpoint balances over the ready heads only (workers listen on nothing)
    answers = {get(endpoint)[1] for _ in range(12)}
    assert answers == {"0", "2"}

    # scaling moves whole gangs: an odd count is refused and changes nothing
    half = server.post(f"/v1/jobs/{job_id}/scale", json={"task": "llm", "replicas": 5})
    assert half.status_code == 422 and "multiple of 2" in half.text
    beyond = server.post(f"/v1/jobs/{job_id}/scale", json={"task": "llm", "replicas": 8})
    assert beyond.status_code == 422 and "2 to 3 service replicas of 2 nodes each" in beyond.text
    assert task_of(server, job_id)["num_nodes"] == 4
    # a gang is placed all or none: with one GPU free, neither of its two replicas starts
    blocker = submit(server, "name: blocker\nnum_nodes: 3\nresources: {accelerators: H100:1}\nrun: sleep 600\n")
    wait_state(server, blocker["id"], "RUNNING")
    assert server.post(f"/v1/jobs/{job_id}/scale", json={"task": "llm", "replicas": 6}).status_code == 200
    wait_for(lambda: len(live(server, job_id)) == 6)
    time.sleep(2)  # several scheduling passes
    assert [live(server, job_id)[rank]["state"] for rank in (4, 5)] == ["PENDING", "PENDING"]
    server.post(f"/v1/jobs/{blocker['id']}/cancel")
    wait_for(lambda: all(live(server, job_id)[rank]["ready"] for rank in (4, 5)), timeout=30)
    assert live(server, job_id)[4]["state"] == live(server, job_id)[5]["state"] == "RUNNING"
    env = env_of(env_dir, 5)
    assert env["SKYPILOT_NODE_RANK"] == "1" and env["MASTER_ADDR"] == live(server, job_id)[4]["addr"]
    assert wait_for(lambda: {get(endpoint)[1] for _ in range(12)} == {"0", "2", "4"}, timeout=10)

    # a killed worker restarts its whole gang; the other gangs run on
    pids = {rank: r["pid"] for rank, r in live(server, job_id).items()}
    os.kill(pids[3], signal.SIGKILL)
    wait_for(lambda: all(live(server, job_id)[rank]["restarts"] == 1 and live(server, job_id)[rank]["ready"]
                         for rank in (2, 3)), timeout=30)
    after = live(server, job_id)
    assert [after[rank]["restarts"] for rank in (0, 1, 4, 5)] == [0, 0, 0, 0]
    assert after[2]["addr"] == addr[2] and after[3]["addr"] == addr[3]  # same names, same addresses
    assert env_of(env_dir, 3, restart=1)["MASTER_ADDR"] == addr[2]
    events = server.get(f"/v1/jobs/{job_id}/events").json()
    assert any(e["cause"] == "gang_restart" and e["subject"] == "llm-2" for e in events)

    # scaling down stops the highest gangs whole
    assert server.post(f"/v1/jobs/{job_id}/scale", json={"task": "llm", "replicas": 4}).status_code == 200
    wait_for(lambda: sorted(live(server, job_id)) == [0, 1, 2, 3], timeout=20)
    retired = {r["rank"]: r["state"] for r in task_of(server, job_id)["replicas"] if r["rank"] >= 4}
    assert wait_for(lambda: {r["rank"]: r["state"] for r in task_of(server, job_id)["replicas"]
                             if r["rank"] >= 4} == {4: "KILLED", 5: "KILLED"}, timeout=20), retired
    assert wait_for(lambda: {get(endpoint)[1] for _ in range(8)} == {"0", "2"}, timeout=10)
    server.post(f"/v1/jobs/{job_id}/cancel")
    wait_state(server, job_id, "CANCELLED", timeout=30)


@pytest.fixture
def fast_rate(monkeypatch):
    """Requests per second measured over 2 s instead of a minute, so 'no traffic' comes soon."""
    from corral.control import balancer

    monkeypatch.setattr(balancer, "RATE_WINDOW_S", 2.0)


def held_get(endpoint: str, out: list) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        out.append((*get(endpoint, timeout=60), time.monotonic() - started))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_service_scales_to_zero_and_back_from_a_request(server, tmp_path: Path, fast_rate) -> None:
    job = submit(server, service_yaml(tmp_path, """  readiness_probe: {path: /, initial_delay_seconds: 8}
  replica_policy: {min_replicas: 0, max_replicas: 2, target_qps_per_replica: 1,
                   upscale_delay_seconds: 1, downscale_delay_seconds: 1}"""))
    job_id = job["id"]
    wait_state(server, job_id, "RUNNING")
    endpoint = wait_for(lambda: task_of(server, job_id)["endpoint"])
    assert task_of(server, job_id)["num_nodes"] == 2  # starts with one service replica (a gang of 2)

    def at_zero() -> bool:
        task = task_of(server, job_id)
        return task["num_nodes"] == 0 and all(r["state"] in ("KILLED", "SUCCEEDED", "FAILED")
                                              for r in task["replicas"])
    wait_for(at_zero, timeout=30)
    job_now = server.get(f"/v1/jobs/{job_id}").json()
    assert job_now["state"] == "RUNNING" and "at zero replicas" in job_now["tasks"][0]["scale"]
    events = server.get(f"/v1/jobs/{job_id}/events").json()
    assert any(e["cause"] == "autoscaled" and "scaled to zero" in e["message"] for e in events)

    # held, then answered once a gang is back (placed by the scheduler, probed on its head)
    out: list = []
    held_get(endpoint, out).join(60)
    status, body, _took = out[0]
    # held, not served by a replica left over: the job was at zero when it was sent, and the
    # gang came back because of it (how long a gang takes to start is not the point here)
    assert (status, body) == (200, "0")
    events = server.get(f"/v1/jobs/{job_id}/events").json()
    assert any(e["cause"] == "autoscaled" and "while at zero" in e["message"] for e in events)

    # at zero again, its GPUs free: another job takes them all; a request then waits its
    # hold (the probe's initial delay, 8 s) and is told why no replica came
    wait_for(at_zero, timeout=30)
    hog = submit(server, "name: hog\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 600\n")
    wait_state(server, hog["id"], "RUNNING")
    out = []
    thread = held_get(endpoint, out)
    time.sleep(4)  # past the rate window: the held request alone keeps a gang wanted
    assert {r["state"] for r in live(server, job_id).values()} == {"PENDING"}
    assert len(live(server, job_id)) == 2
    thread.join(60)
    status, body, took = out[0]
    assert status == 503 and 7.5 < took < 20
    assert "no replica of it became ready within 8s" in body and "wait for a place (reason Resources" in body
    # the waiting gang starts once the GPUs are given back, and the next request is served
    server.post(f"/v1/jobs/{hog['id']}/cancel")
    out = []
    held_get(endpoint, out).join(60)
    assert out[0][:2] == (200, "0")
    # a job requeued while at zero comes back at its initial size (one gang), not empty
    wait_for(at_zero, timeout=30)
    assert server.post(f"/v1/jobs/{job_id}/requeue").status_code == 200
    wait_for(lambda: task_of(server, job_id)["num_nodes"] == 2 and
             server.get(f"/v1/jobs/{job_id}").json()["state"] == "RUNNING", timeout=30)
    # a request held while the job is cancelled is answered then, not at the end of its hold
    wait_for(at_zero, timeout=30)
    hog = submit(server, "name: hog2\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 600\n")
    wait_state(server, hog["id"], "RUNNING")
    out = []
    thread = held_get(endpoint, out)
    time.sleep(1.0)
    server.post(f"/v1/jobs/{job_id}/cancel")
    wait_state(server, job_id, "CANCELLED", timeout=30)
    thread.join(30)
    status, body, took = out[0]
    assert status == 503 and "its job has ended" in body and took < 6, (status, body, took)
    server.post(f"/v1/jobs/{hog['id']}/cancel")


def test_a_service_at_zero_keeps_its_endpoint_across_a_server_restart(corral_home: Path, db_url: str,
                                                                       tmp_path: Path, fast_rate) -> None:
    from conftest import bearer, kill_leftovers
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    text = service_yaml(tmp_path, """  readiness_probe: {path: /, initial_delay_seconds: 8}
  replica_policy: {min_replicas: 0, max_replicas: 1, target_qps_per_replica: 1, downscale_delay_seconds: 1}""")
    try:
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            job = submit(server, text)
            endpoint = wait_for(lambda: task_of(server, job["id"])["endpoint"])
            wait_for(lambda: task_of(server, job["id"])["num_nodes"] == 0 and all(
                r["state"] == "KILLED" for r in task_of(server, job["id"])["replicas"]), timeout=30)
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            assert task_of(server, job["id"])["endpoint"] == endpoint
            host, port = endpoint.rsplit(":", 1)

            def listens() -> bool:
                try:
                    socket.create_connection((host, int(port)), timeout=1).close()  # counted as demand: fine
                    return True
                except OSError:
                    return False
            wait_for(listens, timeout=15)  # once the new server's loop has run a cycle
            out: list = []
            held_get(endpoint, out).join(60)
            assert out[0][:2] == (200, "0")  # the endpoint listened again, held the request, brought a gang
            server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, job["id"], "CANCELLED", timeout=30)
    finally:
        kill_leftovers(corral_home)
