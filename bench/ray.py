"""corral on Ray beside hand-written Ray, on the same local multi-node cluster in one run.

  python bench/ray.py [--samples 5] [--jobs 500]

Starts a Ray cluster on this machine (``tests/ray_lab.py``: a head and two workers with four
declared H100s each, every worker in its own network namespace when run as root) and a corral
server whose ``gpu`` partition is that cluster, then measures:

1. the RL-shaped group (trainer 2 GPUs, rollout x2 1 GPU, reward 1 GPU, buffer CPU) from
   submit to every replica running, through corral, beside the same group written by hand
   in Ray: one placement group and one actor per replica that starts the same process
   (medians over ``--samples``, alternating the two);
2. ``--jobs`` one-GPU jobs running ``true``, end to end, through corral-on-Ray, beside as
   many one-GPU Ray tasks that each run ``true`` as a process;
3. a worker killed under a replica with a restart policy: seconds until corral has it
   RUNNING on the other worker under the same name.

Prints a table (and bench/results/ray.json). Noisy machine: read the ratios."""

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

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ray_lab import start_lab  # noqa: E402

from corral.credentials import read_local_token  # noqa: E402

GROUP = """
name: rl{n}
execution: parallel
primary_tasks: [trainer]
---
name: trainer
resources: {{accelerators: H100:2}}
run: exec sleep 600
---
name: rollout
num_nodes: 2
resources: {{accelerators: H100:1}}
run: exec sleep 600
---
name: reward
resources: {{accelerators: H100:1}}
run: exec sleep 600
---
name: buffer
run: exec sleep 600
"""

# The hand-written Ray version of the same group, run as its own Ray driver.
BASELINE = r'''
import json, subprocess, sys, time
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")

@ray.remote(max_restarts=0)
class Proc:
    def start(self, cmd):
        self.p = subprocess.Popen(["bash", "-c", cmd], start_new_session=True)
        return self.p.pid
    def stop(self):
        self.p.kill(); self.p.wait()

def group():
    bundles = [{"GPU": 2, "CPU": 0.1}, {"GPU": 1, "CPU": 0.1}, {"GPU": 1, "CPU": 0.1}, {"GPU": 1, "CPU": 0.1},
               {"CPU": 0.1}]
    t0 = time.perf_counter()
    pg = placement_group(bundles, strategy="PACK")
    ray.get(pg.ready())
    actors = [Proc.options(num_cpus=0.1, num_gpus=b.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
              .remote() for i, b in enumerate(bundles)]
    ray.get([a.start.remote("exec sleep 600") for a in actors])
    elapsed = time.perf_counter() - t0
    ray.get([a.stop.remote() for a in actors])
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)
    return elapsed

@ray.remote(num_gpus=1, num_cpus=0.1)
def true_task():
    return subprocess.run(["true"]).returncode

mode = sys.argv[2]
if mode == "group":
    print(json.dumps([group() for _ in range(int(sys.argv[3]))]))
else:
    n = int(sys.argv[3])
    t0 = time.perf_counter()
    assert sum(ray.get([true_task.remote() for _ in range(n)])) == 0
    print(json.dumps(time.perf_counter() - t0))
'''


def baseline(address: str, mode: str, n: int):
    done = subprocess.run([sys.executable, "-c", BASELINE, address, mode, str(n)], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


class Corral:
    def __init__(self, address: str):
        self.home = Path(tempfile.mkdtemp(prefix="corral-bench-ray-"))
        (self.home / "config.yaml").write_text(
            f'infra:\n  ray: {{address: "{address}"}}\npartitions:\n  - {{name: gpu, infra: ray}}\n')
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        self.env["CORRAL_HOME"] = str(self.home)
        subprocess.run([sys.executable, "-m", "corral.cli.main", "server", "start"], env=self.env, check=True,
                       capture_output=True, timeout=120)
        url = json.loads((self.home / "server.json").read_text())["url"]
        self.http = httpx.Client(base_url=url, timeout=60, headers={
            "Authorization": f"Bearer {read_local_token(self.home)}"})

    def submit(self, text: str) -> int:
        response = self.http.post("/v1/jobs", json={"yaml": text, "scheduling": {"partition": "gpu"}})
        response.raise_for_status()
        return response.json()["job"]["id"]

    def job(self, job_id: int) -> dict:
        return self.http.get(f"/v1/jobs/{job_id}").json()

    def wait(self, job_id: int, states: tuple[str, ...], timeout: float = 120.0, interval: float = 0.05) -> dict:
        # A long poll (the job answered once it changes, as `corral launch` and the SDK wait), so
        # the server answers a few requests per start, as the hand-written driver waits in
        # ray.get; a server without it is polled every 50 ms (polling faster starved Ray's worker
        # start-up on this 2-core machine).
        deadline = time.monotonic() + timeout
        tag = None
        while time.monotonic() < deadline:
            wait = {"wait": round(min(20.0, max(0.0, deadline - time.monotonic())), 3)} if tag else None
            response = self.http.get(f"/v1/jobs/{job_id}", params=wait, headers={"If-None-Match": tag} if tag else None)
            job, tag = response.json(), response.headers.get("etag")
            if job["state"] in states:
                return job
            if tag is None:
                time.sleep(interval)
        raise TimeoutError(f"job {job_id} not {states} in {timeout}s: {job['state']}")

    def cancel(self, job_id: int) -> None:
        self.http.post(f"/v1/jobs/{job_id}/cancel")
        self.wait(job_id, ("CANCELLED", "SUCCEEDED", "FAILED"), interval=0.05)

    def close(self) -> None:
        subprocess.run([sys.executable, "-m", "corral.cli.main", "server", "stop"], env=self.env,
                       capture_output=True, timeout=60)


def group_through_corral(corral: Corral, n: int) -> float:
    t0 = time.perf_counter()
    job_id = corral.submit(GROUP.format(n=n))
    corral.wait(job_id, ("RUNNING",))
    elapsed = time.perf_counter() - t0
    corral.cancel(job_id)
    return elapsed


def many_jobs(corral: Corral, n: int) -> float:
    t0 = time.perf_counter()
    ids = [corral.submit(f"name: t{i}\nresources: {{accelerators: H100:1}}\nrun: 'true'\n") for i in range(n)]
    for job_id in ids:
        job = corral.wait(job_id, ("SUCCEEDED", "FAILED"), timeout=900, interval=0.05)
        assert job["state"] == "SUCCEEDED", job
    return time.perf_counter() - t0


def recovery(corral: Corral, lab) -> float:
    job_id = corral.submit("""
name: victim
resources: {accelerators: H100:2}
restart: {policy: on_failure, backoff: {initial: 0s}}
run: exec sleep 600
""")
    job = corral.wait(job_id, ("RUNNING",))
    node = job["tasks"][0]["replicas"][0]["node"]
    victim = next(w for w in lab.workers if w.is_named(node))
    t0 = time.perf_counter()
    lab.kill(victim)
    while True:
        replica = corral.job(job_id)["tasks"][0]["replicas"][0]
        if replica["state"] == "RUNNING" and replica["node"] != node:
            elapsed = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > 120:
            raise TimeoutError("the replica did not come back")
        time.sleep(0.05)
    corral.cancel(job_id)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args()
    lab = start_lab(workers=2, gpus=4)
    corral = None
    try:
        corral = Corral(lab.address)
        group_through_corral(corral, 0)  # warm both paths once (Ray's worker pool, imports)
        baseline(lab.address, "group", 1)
        ours, theirs = [], []
        for i in range(args.samples):
            ours.append(group_through_corral(corral, i + 1))
            theirs.extend(baseline(lab.address, "group", 1))
        jobs_ours = many_jobs(corral, args.jobs)
        jobs_theirs = baseline(lab.address, "tasks", args.jobs)
        back = recovery(corral, lab)
    finally:
        if corral is not None:
            corral.close()
        lab.stop()
    g_ours, g_theirs = statistics.median(ours), statistics.median(theirs)
    rows = [
        ("4-task group, submit -> all running (p50)", f"{g_ours * 1000:.0f} ms", f"{g_theirs * 1000:.0f} ms",
         f"{g_ours / g_theirs:.2f}x"),
        (f"{args.jobs} one-GPU `true` jobs, end to end", f"{args.jobs / jobs_ours:.1f} jobs/s",
         f"{args.jobs / jobs_theirs:.1f} tasks/s", f"{jobs_theirs / jobs_ours:.2f}x (throughput, corral / Ray)"),
        ("killed worker's replica RUNNING elsewhere", f"{back:.1f} s", "-", "-"),
    ]
    print(f"Ray cluster: head + 2 workers x 4 GPUs ({'network namespaces' if lab.isolated else 'loopback'})")
    print("| measure | corral on Ray | hand-written Ray | ratio |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    out = ROOT / "bench" / "results" / "ray.json"
    out.write_text(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "isolated": lab.isolated,
                               "group_s": ours, "group_baseline_s": theirs, "jobs": args.jobs,
                               "jobs_s": jobs_ours, "jobs_baseline_s": jobs_theirs, "recovery_s": back}, indent=1))


if __name__ == "__main__":
    main()
