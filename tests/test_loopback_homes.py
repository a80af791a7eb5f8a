"""Replicas of two corral homes on one machine never share a loopback address, and a
readiness probe counts only when the probed replica itself answers (real servers, real
processes, host networking)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import POOL, cli_for, shared_account, submit, wait_for, wait_state

# a port no other test serves on: tests running in parallel share this machine's ports
PORT = 18231

SERVE = """
name: web-{who}
resources: {{ports: {{http: {port}}}}}
readiness_probe: {{http: {{path: /, port: http}}, period: 0.3s}}
run: |
  exec {python} -c '
  import http.server, os
  class Who(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
          self.send_response(200); self.end_headers(); self.wfile.write(b"{who}")
      def log_message(self, *args): pass
  http.server.HTTPServer((os.environ["CORRAL_ADDR"], {port}), Who).serve_forever()'
"""


def _home(root: Path, name: str):
    home = root / name
    home.mkdir()
    (home / "config.yaml").write_text(POOL + shared_account(POOL))
    return cli_for(home, timeout=120)


def test_two_homes_replicas_get_addresses_of_their_own_and_each_serves_its_own(tmp_path: Path) -> None:
    import urllib.request

    homes = {who: _home(tmp_path, who) for who in ("alpha", "beta")}
    try:
        replicas = {}
        for who, corral in homes.items():
            spec = tmp_path / f"{who}.yaml"
            spec.write_text(SERVE.format(who=who, python=sys.executable, port=PORT))
            job = corral("launch", "-d", str(spec), check=True).stdout.strip()

            def ready(corral=corral, job=job) -> dict | None:
                status = json.loads(corral("status", job, "--json", check=True).stdout)
                replica = status["tasks"][0]["replicas"][0]
                return replica if replica["state"] == "RUNNING" and replica["ready"] else None

            replicas[who] = wait_for(ready, timeout=60)
        # before, both homes numbered their first replica 1 and gave it 127.1.0.1: the second
        # could not bind, and its probe was answered by the first home's replica
        assert replicas["alpha"]["addr"] != replicas["beta"]["addr"], replicas
        for who, replica in replicas.items():
            with urllib.request.urlopen(f"http://{replica['addr']}:{PORT}/", timeout=10) as answer:
                assert answer.read().decode() == who
    finally:
        for corral in homes.values():
            corral.stop()


def test_a_probe_answered_by_a_sibling_on_every_address_does_not_make_a_replica_ready(server, tmp_path: Path) -> None:
    # rank 0 serves 0.0.0.0:PORT+1, which also answers on rank 1's address; rank 1 listens on nothing
    job = submit(server, f"""
name: spoof
num_nodes: 2
resources: {{ports: {{http: {PORT + 1}}}}}
readiness_probe: {{tcp: http, period: 0.3s}}
startup_timeout: 4s
restart: {{policy: never}}
run: |
  if [ "$CORRAL_REPLICA" = 0 ]; then
    exec {sys.executable} -m http.server {PORT + 1} --bind 0.0.0.0
  fi
  exec sleep 600
""")
    wait_state(server, job["id"], "RUNNING")

    def replicas() -> dict[int, dict]:
        return {r["rank"]: r for r in server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]}

    wait_for(lambda: replicas()[0]["ready"], timeout=30)
    # rank 1's probe goes to its own address, where rank 0's socket answers: before, it was
    # counted as rank 1's answer and rank 1 became ready; its startup timeout now ends it
    events = wait_for(lambda: [e for e in server.get(f"/v1/jobs/{job['id']}/events").json()
                               if e["cause"] == "startup_timeout"], timeout=30)
    assert not replicas()[1]["ready"]
    said = " ".join(e["message"] or "" for e in events)
    assert "is answered by a process that is not this replica's" in said and "every address" in said, said
    # rank 0's own socket kept it ready: only rank 1 timed out (rank 0 is stopped with its gang
    # right after, so its ready flag is not asked for here: that would race the stop)
    assert {e["subject"] for e in events} == {"spoof-1"}, events
