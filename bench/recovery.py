#!/usr/bin/env python3
"""Per-replica recovery on the local executor: kill -9 one replica of a running job group
and time how long until it is RUNNING again and READY again, and check that its name,
address and GPUs are unchanged and that its peers never stopped.

  python bench/recovery.py [--samples 10] [--json]

The group: two `rollout` replicas serving HTTP behind a readiness probe (period 0.1 s),
restart policy `always` with a 0 s backoff, and a `trainer` that keeps running. The
baseline printed beside corral's figure is what the peers say users get today: SkyPilot
reprovisions the failed task's whole cluster and JobSet recreates the whole child Job;
neither can be run here, so the comparison is the structural one (what else restarts),
and the absolute times are corral's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corral import embedded as daemon  # noqa: E402
from corral.client import Client  # noqa: E402
from corral.settings import Settings  # noqa: E402
from corral.credentials import read_local_token  # noqa: E402

POOL = "nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 16\n    memory: 64\n"
SERVER = r"""
import http.server, os, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(os.environ["CORRAL_HOSTNAME"].encode())
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
with socketserver.TCPServer((os.environ["CORRAL_ADDR"], 8000), H) as s:
    s.serve_forever()
"""
GROUP = """
name: recovery
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: 2
resources: {{accelerators: H100:1}}
ports: {{http: 8000}}
readiness_probe: {{http: {{port: http}}, period: 0.1s}}
restart: {{policy: always, max_restarts: 1000, backoff: {{initial: 0s}}}}
run: exec python {server}
---
name: trainer
depends_on: [{{task: rollout, condition: ready}}]
run: sleep 100000
"""


def replica(client: Client, job_id: int, task: str, rank: int) -> dict:
    job = client.job(job_id)
    return next(t for t in job["tasks"] if t["name"] == task)["replicas"][rank]


def wait(predicate, timeout: float = 30.0, step: float = 0.002):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="corral-recovery-"))
    (home / "config.yaml").write_text(POOL)
    (home / "serve.py").write_text(SERVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    settings = Settings.from_env(env)
    client = Client(daemon.start(settings)["url"], read_local_token(home))
    results = {"to_running_s": [], "to_ready_s": [], "same_identity": [], "peers_untouched": []}
    try:
        job_id = client.submit(GROUP.format(server=home / "serve.py"))["job"]["id"]
        wait(lambda: client.job(job_id)["state"] == "RUNNING" and replica(client, job_id, "trainer", 0)["pid"])
        for _ in range(args.samples):
            before = replica(client, job_id, "rollout", 1)
            peer, trainer = replica(client, job_id, "rollout", 0), replica(client, job_id, "trainer", 0)
            t0 = time.perf_counter()
            os.killpg(before["pid"], signal.SIGKILL)
            after = wait(lambda: (lambda r: r if r["restarts"] > before["restarts"] and r["state"] == "RUNNING"
                                  else None)(replica(client, job_id, "rollout", 1)))
            results["to_running_s"].append(time.perf_counter() - t0)
            wait(lambda: replica(client, job_id, "rollout", 1)["ready"])
            results["to_ready_s"].append(time.perf_counter() - t0)
            results["same_identity"].append((after["hostname"], after["addr"], after["gpus"]) ==
                                            (before["hostname"], before["addr"], before["gpus"]))
            results["peers_untouched"].append(replica(client, job_id, "rollout", 0)["pid"] == peer["pid"] and
                                              replica(client, job_id, "trainer", 0)["pid"] == trainer["pid"])
            time.sleep(0.3)
        client.cancel(job_id)
    finally:
        daemon.stop(settings)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    run, ready = results["to_running_s"], results["to_ready_s"]
    print(f"kill -9 of one rollout replica, {args.samples} samples, local executor ({os.cpu_count()} cores)")
    print(f"  back to RUNNING: p50 {statistics.median(run) * 1000:6.1f} ms   max {max(run) * 1000:6.1f} ms")
    print(f"  back to READY:   p50 {statistics.median(ready) * 1000:6.1f} ms   max {max(ready) * 1000:6.1f} ms")
    print(f"  same name, address and GPUs every time: {all(results['same_identity'])}")
    print(f"  other replicas untouched every time:    {all(results['peers_untouched'])}")
    print("  baseline (structural): SkyPilot job groups reprovision the failed task's cluster; JobSet")
    print("  recreates the whole child Job; Slurm hetjobs cannot restart one component.")


if __name__ == "__main__":
    main()
