"""SkyServe's ``service:`` section: the task runs as a set of replicas behind one endpoint
that balances over the READY ones (real processes, real HTTP through the endpoint)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

from conftest import bearer, submit, wait_for, wait_state

from corral.spec import load_job

SERVER = Path(__file__).parent / "data" / "replica_server.py"


def get(endpoint: str, path: str = "/") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{endpoint}{path}", timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_skyserve_fields_map_to_replicas_probe_and_endpoint() -> None:
    loaded = load_job("service:\n  readiness_probe: {path: /health, initial_delay_seconds: 120, timeout_seconds: 3,"
                      " post_data: {a: 1}}\n  replica_policy: {min_replicas: 1, max_replicas: 4, target_qps_per_replica: 5}\n"
                      "  ports: 8080\n  tls: {keyfile: k, certfile: c}\nrun: x\n")
    task = loaded.spec.tasks[0]
    assert (task.num_nodes, task.min_nodes, task.max_nodes) == (1, 1, 4)
    assert task.ports == {"service": 8080} and task.endpoint.port == "service"
    assert task.readiness_probe.http.path == "/health" and task.readiness_probe.timeout == 3
    assert task.startup_timeout == 120
    assert task.readiness_probe.http.method == "POST" and task.readiness_probe.http.body == {"a": 1}
    said = " ".join(loaded.warnings)
    assert "post_data" not in said and "target_qps_per_replica" not in said and "tls" in said
    assert task.autoscale.target_qps_per_replica == 5 and task.autoscale.upscale_delay == 300
    fixed = load_job("service: {replicas: 3, readiness_probe: /ready}\nresources: {ports: 9000}\nrun: x\n").spec.tasks[0]
    assert fixed.num_nodes == 3 and fixed.ports == {"port0": 9000} and fixed.endpoint.port == "port0"
    again = type(loaded.spec).model_validate_json(loaded.spec.model_dump_json())
    assert again == loaded.spec  # the stored form reads back to itself


def test_the_endpoint_balances_over_ready_replicas_only(server, tmp_path: Path) -> None:
    sick = tmp_path / "sick-"
    job = submit(server, f"""
name: web
service:
  readiness_probe: /health
  replica_policy: {{min_replicas: 1, max_replicas: 3}}
resources: {{ports: 8080}}
envs: {{SICK_FLAG: "{sick}"}}
run: exec {sys.executable} {SERVER}
""")
    running = wait_state(server, job["id"], "RUNNING")
    endpoint = wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"])
    assert running["tasks"][0]["num_nodes"] == 1  # SkyServe starts at min_replicas
    wait_for(lambda: get(endpoint) == (200, "0"), timeout=20)
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "web", "replicas": 3}).status_code == 200
    wait_for(lambda: len(server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]) == 3)
    wait_for(lambda: all(r["ready"] for r in server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]),
             timeout=20)
    wait_for(lambda: {get(endpoint)[1] for _ in range(12)} == {"0", "1", "2"}, timeout=10)
    (tmp_path / "sick-1").touch()  # replica 1 stops being ready: no more traffic for it
    wait_for(lambda: not server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][1]["ready"], timeout=15)
    wait_for(lambda: {get(endpoint)[1] for _ in range(12)} == {"0", "2"}, timeout=10)
    assert server.get(f"/v1/jobs/{job['id']}/endpoints").json()["endpoints"] == {"web": endpoint}
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "web", "replicas": 1}).status_code == 200
    wait_for(lambda: {get(endpoint)[1] for _ in range(6)} == {"0"}, timeout=15)
    causes = [e["cause"] for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
    assert "endpoint" in causes
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")
    assert server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"] is None

    def refused() -> bool:
        try:
            get(endpoint)
        except (urllib.error.URLError, ConnectionError):
            return True
        return False

    wait_for(refused, timeout=10)  # the endpoint closed with its job


def test_no_ready_replica_answers_503(server) -> None:
    job = submit(server, "name: never\nservice: {replicas: 1, readiness_probe: /health}\nresources: {ports: 8080}\n"
                         "run: sleep 60\n")
    wait_state(server, job["id"], "RUNNING")
    endpoint = wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"])
    status, body = get(endpoint)
    assert status == 503 and "no replica" in body
    server.post(f"/v1/jobs/{job['id']}/cancel")


def test_the_endpoint_keeps_its_port_across_a_server_restart(corral_home: Path, db_url: str) -> None:
    from conftest import kill_leftovers
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    text = f"name: web\nservice: {{replicas: 2, readiness_probe: /health}}\nresources: {{ports: 8080}}\n" \
           f"run: exec {sys.executable} {SERVER}\n"
    try:
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            job = submit(server, text)
            endpoint = wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"])
            wait_for(lambda: get(endpoint)[0] == 200, timeout=20)
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            assert server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"] == endpoint
            wait_for(lambda: {get(endpoint)[1] for _ in range(8)} == {"0", "1"}, timeout=20)  # adopted, routed again
            server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, job["id"], "CANCELLED")
    finally:
        kill_leftovers(corral_home)


POST_ONLY = r"""
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # like an OpenAI-style chat endpoint: GET is not allowed
        self.send_response(405); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        good = body == {"model": "m", "messages": [{"role": "user", "content": "hi"}]} and \
            self.headers.get("Authorization") == "Bearer s3cret" and \
            self.headers.get("Content-Type") == "application/json"
        self.send_response(200 if good else 400); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_SERVICE"])), H).serve_forever()
"""


def test_a_post_readiness_probe_is_sent_as_a_post_with_its_body_and_headers(server, tmp_path: Path) -> None:
    (tmp_path / "chat.py").write_text(POST_ONLY)
    job = submit(server, f"""
name: chat
service:
  readiness_probe:
    path: /v1/chat/completions
    post_data: {{model: m, messages: [{{role: user, content: hi}}]}}
    headers: {{Authorization: Bearer s3cret}}
  replicas: 1
  ports: 8080
run: exec {sys.executable} {tmp_path / 'chat.py'}
""")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][0]["ready"], timeout=30)
    endpoint = server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"]
    assert get(endpoint)[0] == 405  # the same server refuses a GET: only the POST made it ready
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")
