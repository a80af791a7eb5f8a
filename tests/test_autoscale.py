"""Load-based autoscaling of a service (SkyServe's target_qps_per_replica): the endpoint
counts the requests it forwards — each request of a keep-alive connection, not only its
first — and the task grows to ceil(rate / target) replicas once that has been wanted for
its upscale delay, within its bounds; a rate that does not call for more moves nothing."""

from __future__ import annotations

import http.client
import sys
from pathlib import Path

from conftest import submit, wait_for, wait_state
from replica_servers import NAMED_SERVER


def _requests(endpoint: str, count: int) -> None:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        for _ in range(count):
            conn.request("GET", "/")
            response = conn.getresponse()
            assert response.status == 200
            response.read()
    finally:
        conn.close()


def _replicas(server, job_id: int) -> list[dict]:
    return server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]["replicas"]


def test_a_service_grows_with_its_request_rate(server, tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(NAMED_SERVER)
    job = submit(server, f"""
name: auto
service:
  readiness_probe: /
  replica_policy: {{min_replicas: 1, max_replicas: 3, target_qps_per_replica: 2,
                   upscale_delay_seconds: 1, downscale_delay_seconds: 3600}}
  ports: 8080
run: exec {sys.executable} {tmp_path / 'serve.py'}
""")
    wait_state(server, job["id"], "RUNNING")
    endpoint = wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["endpoint"])
    wait_for(lambda: _replicas(server, job["id"])[0]["ready"], timeout=30)
    _requests(endpoint, 100)  # 100 in a minute: 1.7/s, under the target of 2 per replica
    import time

    time.sleep(3)  # three upscale delays: a rate that needs one replica keeps one
    assert len(_replicas(server, job["id"])) == 1
    _requests(endpoint, 200)  # 300 on one keep-alive connection: 5/s wants 3 replicas
    wait_for(lambda: len(_replicas(server, job["id"])) == 3, timeout=30)
    events = server.get(f"/v1/jobs/{job['id']}/events").json()
    scaled = [e for e in events if e["cause"] == "autoscaled"]
    assert scaled and "requests/s" in scaled[0]["message"] and "-> 3 replicas" in scaled[-1]["message"]
    wait_for(lambda: all(r["ready"] for r in _replicas(server, job["id"])), timeout=30)
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")
