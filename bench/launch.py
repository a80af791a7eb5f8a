#!/usr/bin/env python3
"""Launch latency and throughput of corral's embedded local server, beside real Slurm.

  python bench/launch.py [--n 1000] [--latency-samples 20] [--with-slurm] [--json] [--network namespace]

Workloads (an idle pool of one node with 8 GPUs and 64 CPUs):
  * latency, one-task job: submit → the replica's process runs (it writes `date +%s.%N`),
    the same definition slurm-lab's `bench.py latency` uses for sbatch → job start;
  * latency, four-task job group: submit → the last of its four replicas runs;
  * throughput: N trivial one-GPU jobs (`run: "true"`) submitted one after another, then
    time from the first submit until none is left (completions/s), as `bench.py throughput --gpu`.
Submissions go through the Python SDK (HTTP); `corral launch -d` latency is shown too, since
the CLI's interpreter start-up is part of what a user waits for.

With --with-slurm, ../shared/tools/slurm-lab is brought up (1 node, 8 GPUs) with PROFILE=fast
and then PROFILE=default and its own bench.py prints Slurm's figures for the same workloads;
the table shows both and the ratios. Slurm's hetjob (its form of a job group) needs one node
per component, so that row runs on a 4-node lab.
"""

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
sys.path.insert(0, str(ROOT))

from corral import embedded as daemon  # noqa: E402
from corral.client import Client  # noqa: E402
from corral.settings import Settings  # noqa: E402
from corral.credentials import read_local_token  # noqa: E402

SLURM_LAB = ROOT.parent / "shared" / "tools" / "slurm-lab"
POOL = "nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 64\n    memory: 512\n"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def wait_file(path: Path, timeout: float = 30.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.001)
    raise TimeoutError(path)


def wait_idle(client: Client, timeout: float = 600.0, poll: float = 0.2) -> float:
    """Poll like slurm-lab's bench polls squeue (every 0.2 s): is any job left?"""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not client.jobs(limit=1):
            return time.time()
        time.sleep(poll)
    raise TimeoutError("jobs left running")


def corral_latency(client: Client, work: Path, samples: int, group: bool, tag: str = "") -> list[float]:
    out = []
    for i in range(samples):
        files = [work / f"lat{tag}-{group}-{i}-{t}" for t in range(4 if group else 1)]
        if group:
            docs = ["name: lat\nexecution: parallel\n"] + [
                f"name: t{t}\nrun: date +%s.%N > {files[t]}.tmp && mv {files[t]}.tmp {files[t]}\n" for t in range(4)]
            text = "---\n".join(docs)
        else:
            text = f"name: lat\nrun: date +%s.%N > {files[0]}.tmp && mv {files[0]}.tmp {files[0]}\n"
        t0 = time.time()
        client.submit(text)
        out.append(max(wait_file(f) for f in files) - t0)
        wait_idle(client, poll=0.01)
        time.sleep(0.05)
    return out


def cli_latency(env: dict[str, str], work: Path, samples: int) -> list[float]:
    out = []
    for i in range(samples):
        target = work / f"cli-{i}"
        spec = work / f"cli-{i}.yaml"
        spec.write_text(f"name: cli\nrun: date +%s.%N > {target}.tmp && mv {target}.tmp {target}\n")
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "corral.cli.main", "launch", "-d", str(spec)], env=env, check=True,
                       capture_output=True)
        out.append(wait_file(target) - t0)
        time.sleep(0.2)
    return out


def corral_throughput(client: Client, n: int) -> dict[str, float]:
    text = "resources: {accelerators: H100:1}\nrun: 'true'\n"
    t0 = time.time()
    for i in range(n):
        client.submit(text, name=f"t-{i}")
    t_sub = time.time()
    t_done = wait_idle(client)
    return {"submit_per_s": n / (t_sub - t0), "complete_per_s": n / (t_done - t0), "total_s": t_done - t0}


def run_corral(args: argparse.Namespace) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    (home / "config.yaml").write_text(POOL + f"infra: {{local: {{network: {args.network}}}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    settings = Settings.from_env(env)
    info = daemon.start(settings)
    client = Client(info["url"], read_local_token(home))
    work = home / "work"
    work.mkdir()
    try:
        corral_latency(client, work, 3, False, tag="-warmup")  # own files: a stale one would read as negative
        one = corral_latency(client, work, args.latency_samples, False)
        four = corral_latency(client, work, args.latency_samples, True)
        cli = cli_latency(env, work, max(3, args.latency_samples // 4))
        thr = corral_throughput(client, args.n)
    finally:
        daemon.stop(settings)
    return {"latency_one": one, "latency_group": four, "latency_cli": cli, "throughput": thr}


def slurm(cmd: list[str], env: dict[str, str], timeout: float = 3600) -> str:
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=timeout).stdout


def run_slurm(profile: str, n: int, samples: int, nodes: int = 1) -> dict[str, object]:
    lab = f"/tmp/slurmlab-bench-{profile}-{nodes}"
    env = dict(os.environ, LAB=lab, NODES=str(nodes), GPUS="8", PROFILE=profile, FRESH="1", ACCOUNTING="none")
    slurm(["bash", str(SLURM_LAB / "start-slurm.sh")], env, timeout=1800)
    env["SLURM_CONF"] = f"{lab}/etc/slurm.conf"
    for line in Path(f"{lab}/slurm.env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = value.strip('"')
    try:
        if nodes > 1:
            return {"hetjob_latency": slurm_hetjob_latency(env, lab, samples)}
        lat = json.loads(slurm([sys.executable, str(SLURM_LAB / "bench.py"), "latency", "--n", str(samples)],
                               env).strip().splitlines()[-1])
        thr = json.loads(slurm([sys.executable, str(SLURM_LAB / "bench.py"), "throughput", "--n", str(n), "--gpu"],
                               env).strip().splitlines()[-1])
        return {"latency": lat["samples"], "throughput": thr}
    finally:
        subprocess.run(["bash", str(SLURM_LAB / "stop-slurm.sh")], env=env, capture_output=True)


def slurm_hetjob_latency(env: dict[str, str], lab: str, samples: int) -> list[float]:
    """A four-component hetjob (Slurm's job group): sbatch → the last component runs."""
    out = []
    for i in range(samples):
        files = [Path(f"{lab}/het-{i}-{c}") for c in range(4)]
        for stale in files:  # a lab directory may hold an earlier run's files
            stale.unlink(missing_ok=True)
        script = Path(f"{lab}/het-{i}.sh")
        script.write_text("#!/bin/bash\n" + "\n#SBATCH hetjob\n".join(["#SBATCH -N1 -o /dev/null"] * 4) + "\n"
                          + "".join(f"srun --het-group={c} bash -c 'date +%s.%N > {files[c]}' &\n" for c in range(4))
                          + "wait\n")
        t0 = time.time()
        slurm(["sbatch", str(script)], env)
        out.append(max(wait_file(f, timeout=300) for f in files) - t0)
    return out


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:8.1f} ms   p99 {pct(values, 99) * 1000:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="jobs in the throughput run")
    parser.add_argument("--latency-samples", type=int, default=20)
    parser.add_argument("--with-slurm", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--network", choices=("host", "namespace"), default="host",
                        help="the local infra's network: namespace gives each replica its own (root)")
    args = parser.parse_args()
    if getattr(args, "with_slurm", False) and not SLURM_LAB.is_dir():
        sys.exit(f"launch: --with-slurm needs slurm-lab at {SLURM_LAB} (the shared tools beside the checkout)")
    results: dict[str, object] = {"corral": run_corral(args)}
    if args.with_slurm:
        samples = min(args.latency_samples, 10)
        results["slurm_fast"] = run_slurm("fast", args.n, samples)
        results["slurm_default"] = run_slurm("default", args.n, samples)
        results["slurm_hetjob"] = run_slurm("fast", args.n, 3, nodes=4)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    c = results["corral"]
    print(f"corral, one node x 8 GPUs, idle pool ({os.cpu_count()} cores)")
    print(f"  submit->running, one-task job (SDK)   {summary(c['latency_one'])}")
    print(f"  submit->running, 4-task group (SDK)   {summary(c['latency_group'])}")
    print(f"  submit->running, `corral launch -d`   {summary(c['latency_cli'])}")
    thr = c["throughput"]
    print(f"  {args.n} one-GPU jobs: submit {thr['submit_per_s']:.0f}/s, end-to-end {thr['complete_per_s']:.1f} jobs/s "
          f"({thr['total_s']:.1f} s)")
    if args.with_slurm:
        print("\nsame workloads on real Slurm 22.05 (slurm-lab), same machine, same run")
        for key in ("slurm_fast", "slurm_default"):
            s = results[key]
            lat, tput = s["latency"], s["throughput"]["complete_per_s"]
            print(f"  {key:14s} sbatch->running {summary(lat)};  {args.n} one-GPU jobs {tput:.1f} jobs/s")
            print(f"      ratios: latency p50 slurm/corral = {statistics.median(lat) / statistics.median(c['latency_one']):.1f}x, "
                  f"throughput corral/slurm = {thr['complete_per_s'] / tput:.1f}x")
        het = results["slurm_hetjob"]["hetjob_latency"]
        print(f"  4-component hetjob (4-node lab, fast) sbatch->all running {summary(het)};  "
              f"ratio slurm/corral = {statistics.median(het) / statistics.median(c['latency_group']):.0f}x")


if __name__ == "__main__":
    main()
