#!/usr/bin/env python3
"""How long a person waits for the CLI: wall time of read commands against a warm embedded
server, beside the interpreter's own start-up (``python -c pass``) measured in the same run.

  python bench/cli.py [--samples 20] [--jobs 50] [--json]

The server is started once in a temporary CORRAL_HOME with ``--jobs`` jobs in its queue (half
pending behind a held GPU, half finished) so the tables have rows to print; each command is
then run ``--samples`` times, alternating with the baseline so machine noise hits both alike.
Output is piped (as in scripts); the figure is the median and p90 wall time per command and
its ratio to the bare interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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

POOL = "nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 64\n    memory: 512\n"
COMMANDS = [["queue"], ["queue", "--all"], ["nodes"], ["status", "{job}"], ["queue", "--json"]]


def wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-400:]}")
    return took


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="corral-bench-cli-"))
    (home / "config.yaml").write_text(POOL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    # an installed corral reads its compiled bytecode; with this set (some sandboxes do) every
    # command would compile corral's modules again, a cost no user pays
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["CORRAL_HOME"] = str(home)
    settings = Settings.from_env(env)
    info = daemon.start(settings)
    results: dict[str, dict[str, float]] = {}
    try:
        with Client(info["url"], read_local_token(home)) as client:
            holder = client.submit("resources: {accelerators: H100:8}\nrun: sleep 600\n", name="holder")["job"]
            for i in range(args.jobs // 2):
                client.submit("run: 'true'\n", name=f"done-{i}")
            for i in range(args.jobs - args.jobs // 2):
                client.submit("resources: {accelerators: H100:1}\nrun: 'true'\n", name=f"waits-{i}")
            deadline = time.time() + 60
            while time.time() < deadline and any(j["state"] in ("PENDING", "RUNNING") and j["name"].startswith("done")
                                                   for j in client.jobs()):
                time.sleep(0.2)
            time.sleep(2)  # the trivial jobs finish
        installed = shutil.which("corral")  # the console script a user types
        corral = [installed] if installed else [sys.executable, "-m", "corral.cli.main"]
        baseline = [sys.executable, "-c", "pass"]
        runs: dict[str, list[float]] = {"python -c pass": []}
        for _ in range(2):  # warm the page cache for both
            wall(baseline, env)
            wall(corral + ["queue"], env)
        for _ in range(args.samples):
            runs["python -c pass"].append(wall(baseline, env))
            for cmd in COMMANDS:
                argv = [part.replace("{job}", str(holder["id"])) for part in cmd]
                runs.setdefault("corral " + " ".join(cmd), []).append(wall(corral + argv, env))
        base = statistics.median(runs["python -c pass"])
        for label, values in runs.items():
            results[label] = {"p50_ms": statistics.median(values) * 1000, "p90_ms": pct(values, 90) * 1000,
                              "ratio": statistics.median(values) / base}
    finally:
        daemon.stop(settings)
    if args.json:
        print(json.dumps({"samples": args.samples, "jobs": args.jobs, "results": results}, indent=1))
        return
    print(f"CLI wall time, {args.samples} samples each, warm server with {args.jobs} jobs, output piped")
    print(f"{'command':<22} {'p50 ms':>8} {'p90 ms':>8} {'x python -c pass':>17}")
    for label, r in results.items():
        print(f"{label:<22} {r['p50_ms']:>8.1f} {r['p90_ms']:>8.1f} {r['ratio']:>17.2f}")


if __name__ == "__main__":
    main()
