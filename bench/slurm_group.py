"""The RL-shaped job group on a real Slurm, through corral beside the same group written by
hand as a Slurm heterogeneous job with the usual launch glue, in one run.

  python bench/slurm_group.py [--samples 3]

Needs the slurm-lab running (``NODES=4 PROFILE=fast ./start-slurm.sh`` in
../shared/tools/slurm-lab) and ``SLURM_CONF`` (or /tmp/slurmlab/slurm.env). Measures, alternating
the two, from submit to every replica up and the reward service answering:

* corral: ``infra: slurm`` partition; the group (trainer 2x8 GPUs, rollout 2x4 GPUs, reward 1
  GPU with a readiness probe, buffer CPU) becomes one Slurm job sized to its gang and runs
  inside it as job steps; "up" = every replica RUNNING and the reward READY;
* by hand: ``bench/slurm_glue/rl_hetjob.sbatch``, a heterogeneous job (one component per
  role) whose script finds its nodes and addresses, picks ports, starts the reward, polls it,
  starts the rest and waits until every step runs; "up" = that script's marker file.

Also counts the lines of launch glue each needs (the hand-written script's shell lines that
are neither ``#SBATCH`` directives nor comments; corral's YAML has none, only the spec).
Prints a table and writes bench/results/slurm_group.json. Noisy machine: read the ratio."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLUE = ROOT / "bench" / "slurm_glue" / "rl_hetjob.sbatch"

GROUP = """
name: rl{n}
execution: parallel
primary_tasks: [trainer]
---
name: trainer
num_nodes: 2
resources: {{accelerators: H100:8}}
depends_on: [{{task: reward}}]
run: exec sleep 600
---
name: rollout
num_nodes: 2
resources: {{accelerators: H100:4}}
run: exec sleep 600
---
name: reward
resources: {{accelerators: H100:1}}
ports: {{http: 8000}}
readiness_probe: {{http: {{path: /, port: http}}, period: 0.2s}}
run: exec python3 -m http.server $CORRAL_PORT_HTTP
---
name: buffer
run: exec sleep 600
"""

SITE = "partitions:\n  - {name: here, nodes: ['*']}\n  - {name: gpu, infra: slurm, slurm_partition: gpu}\n"


def slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    lab = Path("/tmp/slurmlab/slurm.env")
    if "SLURM_CONF" not in env and lab.exists():
        for line in lab.read_text().splitlines():
            if "SLURM_CONF=" in line:
                env["SLURM_CONF"] = line.split("=", 1)[1].strip().strip("'\"")
    return env


def glue_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines()
               if line.strip() and not line.lstrip().startswith("#"))


def corral_once(client, n: int) -> float:
    start = time.monotonic()
    job = client.submit(GROUP.format(n=n), scheduling={"partition": "gpu"})["job"]
    while True:
        data = client.job(job["id"])
        replicas = [r for t in data["tasks"] for r in t["replicas"]]
        if data["state"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"corral job {job['id']} {data['state']}: {data.get('message')}")
        if data["state"] == "RUNNING" and all(r["state"] == "RUNNING" and r["ready"] for r in replicas):
            break
        time.sleep(0.05)
    took = time.monotonic() - start
    client.cancel(job["id"])
    client.wait(job["id"], timeout=60)
    return took


def by_hand_once(env: dict[str, str], work: Path, n: int) -> float:
    marker = work / f"het-{n}.up"
    start = time.monotonic()
    slurm_id = subprocess.run(["sbatch", "--parsable", str(GLUE)], env={**env, "MARKER": str(marker)},
                              capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        while not marker.exists():
            if time.monotonic() - start > 300:
                raise RuntimeError("the heterogeneous job did not come up within 300 s")
            time.sleep(0.05)
        return time.monotonic() - start
    finally:
        subprocess.run(["scancel", slurm_id], env=env, capture_output=True)
        while subprocess.run(["squeue", "-h", "-j", slurm_id], env=env, capture_output=True,
                             text=True).stdout.strip():
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    env = slurm_env()
    os.environ.update({k: v for k, v in env.items() if k == "SLURM_CONF"})
    sys.path.insert(0, str(ROOT))
    from corral.client import Client
    from corral.executors.slurm.cli import available

    why = available()
    if why is not None:
        sys.exit(f"no usable Slurm: {why} (start ../shared/tools/slurm-lab/start-slurm.sh)")
    work = Path(tempfile.mkdtemp(prefix="corral-bench-slurm-"))
    home = work / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    corral_env = {**env, "CORRAL_HOME": str(home)}
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=corral_env, check=True, capture_output=True)
    os.environ["CORRAL_HOME"] = str(home)
    corral_s, hand_s = [], []
    try:
        with Client() as client:
            for n in range(args.samples):
                corral_s.append(corral_once(client, n))
                hand_s.append(by_hand_once(env, work, n))
                print(f"sample {n + 1}: corral {corral_s[-1]:.2f} s, by hand {hand_s[-1]:.2f} s", flush=True)
    finally:
        subprocess.run(cli + ["server", "stop"], env=corral_env, capture_output=True)
    spec_lines = sum(1 for line in GROUP.splitlines() if line.strip() and line.strip() != "---")
    result = {
        "samples": args.samples,
        "corral_up_s": statistics.median(corral_s), "by_hand_up_s": statistics.median(hand_s),
        "ratio_corral_over_hand": statistics.median(corral_s) / statistics.median(hand_s),
        "corral_all_s": corral_s, "by_hand_all_s": hand_s,
        "glue_lines": {"corral": 0, "by_hand": glue_lines(GLUE)},
        "spec_lines": {"corral_yaml": spec_lines},
    }
    print()
    print(f"{'':28}{'corral':>10}{'by hand':>10}{'ratio':>8}")
    print(f"{'submit -> all up (median s)':28}{result['corral_up_s']:>10.2f}{result['by_hand_up_s']:>10.2f}"
          f"{result['ratio_corral_over_hand']:>8.2f}")
    print(f"{'lines of launch glue':28}{0:>10}{result['glue_lines']['by_hand']:>10}")
    print(f"(corral's YAML: {spec_lines} lines of spec; the hand-written job: {result['glue_lines']['by_hand']} shell "
          f"lines beside its #SBATCH directives)")
    out = ROOT / "bench" / "results" / "slurm_group.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
