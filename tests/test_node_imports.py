"""What a node-side process imports to start a replica. A Ray worker imports the replica actor's
module for every actor it starts, on every node, beside the replicas of the job it starts: the
server's models (pydantic, the job spec, the pool, the accounts' config) are not needed there and
had tripled that import (158 ms of CPU per actor on a 2-core machine, 5 actors for the RL group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import json, sys, tempfile
from pathlib import Path
import corral.executors.ray.actor  # what the worker imports for the actor class
from corral.node.runner import NodeRunner

d = Path(tempfile.mkdtemp(dir=sys.argv[1]))
runner = NodeRunner(d / "runs", d / "rt", "imports-probe")
proc = runner.spawn("imports-probe-1", 1, None, "true", {"PATH": "/usr/bin:/bin"}, None, d / "log", True)
heavy = ("pydantic", "yaml", "sqlalchemy", "fastapi", "corral.spec", "corral.pool", "corral.auth",
         "corral.executors.contract", "corral.settings")
print(json.dumps({"code": proc.wait(), "heavy": sorted(m for m in sys.modules if m.startswith(heavy))}))
"""


def test_starting_a_replica_on_a_node_imports_none_of_the_server_s_models(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"code": 0, "heavy": []}, said


ACTOR_PROBE = r"""
import json, os, sys, tempfile
from pathlib import Path
os.environ["CORRAL_RAY_DIR"] = tempfile.mkdtemp(dir=sys.argv[1])
import ray
ray.get_gpu_ids = lambda: []  # (no Ray worker here: the GPUs Ray would have bound)
from corral.executors.ray.actor import ReplicaActor

actor = ReplicaActor("imports-actor")
said = actor.start({"key": "1.main.0.a1", "job_id": 1, "setup": None, "run": "true", "env": {"PATH": "/usr/bin:/bin"},
                    "cwd": None, "hosts": True, "repo": None, "dirs": [], "container": None, "file_mounts": []},
                   "", "{}")
end = actor.wait()
heavy = ("pydantic", "sqlalchemy",  # (not yaml: importing ray brings it) "fastapi", "corral.spec", "corral.pool", "corral.auth",
         "corral.executors.contract", "corral.settings")
print(json.dumps({"started": "node_pid" in said, "code": end["code"],
                  "heavy": sorted(m for m in sys.modules if m.startswith(heavy))}))
"""


def test_a_ray_actor_s_start_imports_none_of_the_server_s_models(tmp_path: Path) -> None:
    """The actor's whole start, not only its module: a start that imported the contract for
    its ``Container`` (pydantic, the pool, the accounts: 178 ms here) made each replica of a
    group on Ray 200-350 ms later to start."""
    done = subprocess.run([sys.executable, "-c", ACTOR_PROBE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"started": True, "code": 0, "heavy": []}, said
