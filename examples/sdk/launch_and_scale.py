#!/usr/bin/env python3
"""The Python SDK end to end: launch a job group (an elastic web service and a worker that
finds it by name), wait until every replica is READY, talk to the service through its balanced
endpoint and to one replica by its address, scale the service up, see the new replicas take
traffic, then cancel the job.

    python examples/sdk/launch_and_scale.py        # against the embedded server of CORRAL_HOME
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from corral.client import Client, CorralError

HERE = Path(__file__).resolve().parent

GROUP = [
    {"name": "sdk-demo", "execution": "parallel", "primary_tasks": ["worker"]},
    {"name": "web", "num_nodes": {"min": 1, "max": 3}, "ports": {"http": 8080},
     "readiness_probe": {"http": {"path": "/health", "port": "http"}, "period": "0.5s"},
     "endpoint": {"port": "http"},
     "run": f"exec {sys.executable} {HERE / 'replica.py'}"},
    {"name": "worker", "depends_on": [{"task": "web", "condition": "ready"}],
     "run": "sleep 600"},
]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode().strip()


def main() -> int:
    with Client.local() as corral:
        job = corral.submit(GROUP)["job"]
        print(f"launched job {job['id']} ({job['name']})")
        try:
            corral.wait(job["id"], ready=True, timeout=120)
            peers = corral.endpoints(job["id"])
            endpoint = peers["endpoints"]["web"]
            replica = peers["tasks"]["web"]["replicas"][0]
            print(f"every replica ready; the web endpoint is {endpoint}")
            print(f"through the endpoint: {get(f'http://{endpoint}/')}")
            print(f"web-0 directly at {replica['addr']}: {get('http://{}:{}/'.format(replica['addr'], replica['ports']['http']))}")
            corral.scale(job["id"], "web", 3)
            while len(corral.job(job["id"])["tasks"][0]["replicas"]) < 3:  # the loop adds them
                corral.wait(job["id"], ready=True, timeout=120)
            corral.wait(job["id"], ready=True, timeout=120)
            answers = sorted({get(f"http://{endpoint}/") for _ in range(12)})
            print(f"scaled web to 3; the endpoint answered from: {', '.join(answers)}")
            return 0 if len(answers) == 3 else 1
        except (CorralError, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            corral.cancel(job["id"])
            print(f"cancelled job {job['id']}")


if __name__ == "__main__":
    sys.exit(main())
