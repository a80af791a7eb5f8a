"""Job-group service semantics through a real server and real processes: per-replica
addresses and names, discovery files, readiness-gated start order, restarts that keep the
name, address and GPUs, liveness, stop signals, and checkpoint dirs across restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import submit, wait_for, wait_state

ECHO_SERVER = r"""
import http.server, os, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{os.environ['CORRAL_HOSTNAME']} {os.environ['CORRAL_RESTART_COUNT']}".encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
with socketserver.TCPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_HTTP"])), H) as s:
    s.serve_forever()
"""


def events(server, job_id: int) -> list[dict]:
    return server.get(f"/v1/jobs/{job_id}/events").json()


def replicas(job: dict, task: str) -> list[dict]:
    return next(t for t in job["tasks"] if t["name"] == task)["replicas"]


def test_names_addresses_discovery_and_readiness_gated_start(server, tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(ECHO_SERVER)
    client = tmp_path / "client.py"
    client.write_text(r"""
import json, os, socket, urllib.request
job = os.environ["CORRAL_JOB_NAME"]
peers = json.load(open(os.environ["CORRAL_PEERS_FILE"]))
assert all(r["ready"] for r in peers["tasks"]["rollout"]["replicas"]), peers
for rank in (0, 1):
    name = f"rollout-{rank}.{job}"
    addr = socket.getaddrinfo(name, 8000)[0][4][0]
    assert addr == peers["tasks"]["rollout"]["replicas"][rank]["addr"], (addr, peers)
    print(urllib.request.urlopen(f"http://{name}:8000/", timeout=5).read().decode())
""")
    job = submit(server, f"""
name: disco
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: 2
ports: {{http: 8000}}
readiness_probe: {{http: {{port: http, path: /}}, initial_delay: 0.3s, period: 0.2s}}
run: sleep 0.5; exec python {tmp_path}/serve.py
---
name: trainer
depends_on: [{{task: rollout, condition: ready}}]
run: |
  python {client}
  addr=$(awk '$2 == "rollout-1.disco" {{print $1}}' "$CORRAL_HOSTS_FILE")
  python -c "import urllib.request,sys; print('shell', urllib.request.urlopen('http://' + sys.argv[1] + ':8000/').read().decode())" "$addr"
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    log = server.get(f"/v1/jobs/{job['id']}/logs", params={"replica": "trainer-0"}).text
    assert done["state"] == "SUCCEEDED", log
    assert "rollout-0.disco 0" in log and "rollout-1.disco 0" in log and "shell rollout-1.disco 0" in log
    rollouts = replicas(done, "rollout")
    assert len({r["addr"] for r in rollouts}) == 2 and all(r["addr"].startswith("127.") for r in rollouts)
    assert all(r["addr"] != "127.0.0.1" for r in rollouts)
    story = events(server, job["id"])
    ready_at = max(e["ts"] for e in story if e["cause"] == "ready" and e["subject"].startswith("rollout"))
    trainer_at = next(e["ts"] for e in story if e["subject"] == "trainer-0" and e["to_state"] == "RUNNING")
    assert trainer_at >= ready_at  # the trainer started only once both rollouts were ready
    endpoints = server.get(f"/v1/jobs/{job['id']}/endpoints").json()
    r1 = endpoints["tasks"]["rollout"]["replicas"][1]
    assert r1["hostname"] == "rollout-1.disco" and r1["endpoints"] == {"http": f"{r1['addr']}:8000"}
    assert not (Path(server.state.settings.runtime_dir) / str(job["id"])).exists()  # freed when the job ended


def test_restart_keeps_rank_name_address_gpus_and_checkpoint_dir(server, tmp_path: Path) -> None:
    job = submit(server, """
name: phoenix
resources: {accelerators: H100:2}
restart: {policy: on_failure, max_restarts: 3, backoff: {initial: 0.2s, factor: 2}}
run: |
  echo "attempt $CORRAL_RESTART_COUNT at $CORRAL_ADDR gpus $CUDA_VISIBLE_DEVICES" >> $CORRAL_CHECKPOINT_DIR/history
  if [ "$CORRAL_RESTART_COUNT" -lt 2 ]; then exit 3; fi
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=20)
    assert done["state"] == "SUCCEEDED"
    (replica,) = replicas(done, "phoenix")
    assert replica["restarts"] == 2 and replica["exit_code"] == 0 and replica["last_exit_code"] == 3
    history = (Path(server.state.settings.checkpoints_dir) / str(job["id"]) / "phoenix" / "history").read_text()
    lines = history.splitlines()
    assert [line.split()[1] for line in lines] == ["0", "1", "2"]
    assert len({line.split(" at ")[1] for line in lines}) == 1  # same address and GPUs each time
    scheduled = [e for e in events(server, job["id"]) if e["cause"] == "restart_scheduled"]
    assert len(scheduled) == 2 and "exit code 3" in scheduled[0]["message"] and "in 0.2s" in scheduled[0]["message"]
    assert "in 0.4s" in scheduled[1]["message"]  # exponential backoff


def test_restart_policy_gives_up_and_exit_code_filter(server) -> None:
    stubborn = submit(server, "name: stubborn\nrestart: {policy: always, max_restarts: 2, backoff: {initial: 0.1s}}\n"
                              "run: exit 4\n")
    filtered = submit(server, "name: filtered\nrestart: {policy: on_failure, exit_codes: [5], backoff: {initial: 0.1s}}\n"
                              "run: exit 3\n")
    done = wait_state(server, stubborn["id"], "FAILED", "SUCCEEDED", timeout=20)
    assert done["state"] == "FAILED" and replicas(done, "stubborn")[0]["restarts"] == 2 and done["exit_code"] == 4
    done = wait_state(server, filtered["id"], "FAILED", "SUCCEEDED", timeout=20)
    assert done["state"] == "FAILED" and replicas(done, "filtered")[0]["restarts"] == 0


def test_liveness_failure_restarts_the_replica(server) -> None:
    job = submit(server, """
name: zombie
ports: {http: 9}
liveness_probe: {tcp: http, period: 0.2s, failure_threshold: 2, timeout: 0.2s}
grace_period: 0.5s
restart: {policy: on_failure, max_restarts: 1, backoff: {initial: 0.1s}}
run: sleep 30
""")
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=30)
    causes = [e["cause"] for e in events(server, job["id"])]
    assert causes.count("liveness_failed") == 2 and "restart_scheduled" in causes
    assert done["state"] == "FAILED" and replicas(done, "zombie")[0]["restarts"] == 1


def test_failed_dependency_fails_the_waiting_task_and_the_job(server) -> None:
    job = submit(server, """
name: brokendep
execution: parallel
primary_tasks: [trainer]
---
name: reward
run: exit 9
readiness_probe: {exec: "false"}
---
name: trainer
depends_on: [{task: reward, condition: ready}]
run: echo should never run
""")
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=20)
    trainer = replicas(done, "trainer")[0]
    assert done["state"] == "FAILED" and trainer["state"] == "FAILED" and trainer["pid"] is None
    assert any(e["cause"] == "dependency_failed" for e in events(server, job["id"]))


def test_start_order_on_success_and_custom_stop_signal(server, tmp_path: Path) -> None:
    marker, got = tmp_path / "prepared", tmp_path / "got"
    job = submit(server, f"""
name: ordered
execution: parallel
primary_tasks: [main]
---
name: prepare
run: sleep 0.3; touch {marker}
---
name: main
depends_on: [{{task: prepare, condition: succeeded}}]
run: test -f {marker}
---
name: side
stop_signal: SIGUSR1
grace_period: 5s
run: |
  trap 'echo usr1 > {got}; exit 0' USR1
  while true; do sleep 0.05; done
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=20)
    assert done["state"] == "SUCCEEDED", done
    assert got.read_text().strip() == "usr1"
    stop = next(e for e in events(server, job["id"]) if e["subject"] == "side-0" and e["cause"] == "termination_delay"
                and e["to_state"] is None)
    assert "SIGUSR1 sent" in stop["message"]


def test_discovery_files_follow_restarts(server, tmp_path: Path) -> None:
    job = submit(server, """
name: watcher
execution: parallel
primary_tasks: [observer]
---
name: flaky
restart: {policy: always, max_restarts: 1, backoff: {initial: 0.5s}}
run: sleep 0.3; exit 1
---
name: observer
run: sleep 3
""")
    peers = Path(server.state.settings.runtime_dir) / str(job["id"]) / "peers.json"

    def flaky_state() -> str:
        try:
            return json.loads(peers.read_text())["tasks"]["flaky"]["replicas"][0]["state"]
        except (OSError, ValueError):
            return ""

    assert wait_for(lambda: flaky_state() == "RESTARTING", timeout=10)
    assert wait_for(lambda: flaky_state() == "RUNNING", timeout=10)
    time.sleep(0.1)
    assert json.loads(peers.read_text())["tasks"]["flaky"]["replicas"][0]["restarts"] == 1
    wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=20)


def test_time_limit_warns_then_stops_the_job_as_timeout(server, tmp_path: Path) -> None:
    warned = tmp_path / "warned"
    job = submit(server, f"""
name: slowpoke
execution: parallel
---
name: main
time_limit: 1.5s
signal_before_timeout: {{signal: USR1, seconds: 1s}}
grace_period: 1s
run: |
  trap 'echo usr1 >> {warned}' USR1
  while true; do sleep 0.05; done
---
name: helper
run: sleep 60
""")
    start = time.monotonic()
    done = wait_state(server, job["id"], "TIMEOUT", "FAILED", "SUCCEEDED", timeout=20)
    assert done["state"] == "TIMEOUT", done
    assert 1.4 <= time.monotonic() - start < 6
    assert warned.read_text().strip() == "usr1"
    causes = [(e["subject"], e["cause"]) for e in events(server, job["id"])]
    assert ("main-0", "time_limit_warning") in causes and ("main-0", "time_limit") in causes
    assert ("helper-0", "job_time_limit") in causes
    assert "main-0 reached its time limit" in done["message"]


def test_elastic_scale_up_and_down_with_live_peers_file(server, tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    job = submit(server, f"""
name: elastic
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: {{min: 1, max: 4, initial: 2}}
resources: {{accelerators: H100:1}}
stop_signal: SIGUSR1
run: |
  trap 'echo $CORRAL_REPLICA >> {stopped}; exit 0' USR1
  while true; do sleep 0.05; done
---
name: trainer
run: sleep 60
""")
    wait_state(server, job["id"], "RUNNING")
    peers = Path(server.state.settings.runtime_dir) / str(job["id"]) / "peers.json"

    def rollouts() -> list[dict]:
        return json.loads(peers.read_text())["tasks"]["rollout"]["replicas"]

    assert wait_for(lambda: len(rollouts()) == 2)
    for bad, words in [(5, "between 1 and 4"), (0, "between 1 and 4")]:
        response = server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": bad})
        assert response.status_code == 422 and words in response.json()["detail"][0]["msg"]
        assert response.json()["detail"][0]["loc"] == ["body", "replicas"]
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "trainer", "replicas": 2}).status_code == 422
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "nope", "replicas": 2}).status_code == 404

    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": 4}).status_code == 200
    assert wait_for(lambda: [r["state"] for r in rollouts()] == ["RUNNING"] * 4, timeout=10)
    current = wait_for(lambda: (lambda j: j if sum(r["state"] == "RUNNING" for r in replicas(j, "rollout")) == 4
                                else None)(server.get(f"/v1/jobs/{job['id']}").json()))
    gpus = [tuple(r["gpus"]) + (r["node"],) for r in replicas(current, "rollout") if r["state"] == "RUNNING"]
    assert len(set(gpus)) == 4  # each new replica got GPUs of its own
    assert len({r["addr"] for r in rollouts()}) == 4

    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": 1}).status_code == 200
    assert wait_for(lambda: [r["rank"] for r in rollouts()] == [0], timeout=10)
    assert sorted(stopped.read_text().split()) == ["1", "2", "3"]  # highest ranks, with the stop signal
    assert [r["rank"] for r in server.get(f"/v1/jobs/{job['id']}/endpoints").json()["tasks"]["rollout"]["replicas"]] == [0]

    # grow again: retired ranks come back under the same names
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": 2}).status_code == 200
    try:
        wait_for(lambda: [(r["rank"], r["state"]) for r in rollouts()] == [(0, "RUNNING"), (1, "RUNNING")], timeout=10)
    except AssertionError:
        raise AssertionError(json.dumps(events(server, job["id"])[-12:], indent=0)
                             + json.dumps(server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0])) from None
    server.post(f"/v1/jobs/{job['id']}/cancel")
    assert wait_state(server, job["id"], "CANCELLED")["state"] == "CANCELLED"
