#!/usr/bin/env python3
"""How faithfully ``corral sim --policy slurm`` models real Slurm: the same few hundred jobs
of a shared trace, time-compressed, run on a real Slurm 22.05 (shared/tools/slurm-lab, 4
virtual nodes x 8 GPUs) and through corral's simulator on the same cluster; then the two
schedules are compared job by job.

  python bench/slurm_fidelity.py [--trace philly-pollux.csv] [--jobs 200] [--span 120] [--seed 0]
                                 [--accounts] [--debug] [--replay bench/results/slurm_fidelity_jobs_<time>.csv]

Compression: the window's submit times are scaled to ``--span`` seconds; run times are
scaled so the offered load is ~90 % of the 32 GPUs over the span, and kept within 2 s and a
third of the span;
time limits are the run time times a seeded over-estimate (1-10x), rounded up to whole
minutes (Slurm's unit). Both sides get exactly these jobs. Slurm is configured as the lab
does (multifactor: age 1000, fair share 10000, job size 100, partition 1000; backfill)
with event-driven scheduling and backfill every second (bf_interval=1, bf_resolution=1) so
compression does not hide its decisions behind the default 30 s backfill period. By
default every job is charged to one account, so fair share cannot differ between the two;
``--accounts`` charges each trace user's jobs to an account of its own (sacctmgr), bills
usage by GPUs (one CPU per GPU asked), recomputes priorities every minute
(PriorityCalcPeriod=1, the smallest) and uses the classic fair-share formula
(PriorityFlags=NO_FAIR_TREE, the one corral models; 22.05's default is Fair Tree), so the
comparison includes fair share. Use a longer ``--span`` there (e.g. 600) so usage has time
to move priorities.

Printed: Kendall's tau between the two start orders, Pearson and Spearman correlation of
per-job waits, mean and p50 wait on each side, and the share of jobs whose start differs by
less than 5 s. Results are also appended to bench/results/slurm_fidelity.jsonl, and each job's two starts
written to bench/results/slurm_fidelity_jobs_<time>.csv (with the nodes Slurm chose); with
``--accounts``, Slurm's sshare and sprio sampled every 15 s go to slurm_fidelity_prio_<time>.txt.
``--replay CSV`` compares the model with such a recorded run instead of starting the lab (the
same --trace/--jobs/--span/--seed/--accounts must be given): seconds instead of a quarter of
an hour, for working on the model."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corral.scheduler import Policy, PriorityWeights  # noqa: E402
from corral.sim.engine import cluster, simulate  # noqa: E402
from corral.sim.trace import TraceJob, load_trace  # noqa: E402

LAB = Path(os.environ.get("LAB", "/tmp/slurmlab-fidelity"))
TOOLS = ROOT.parent / "shared" / "tools" / "slurm-lab"
NODES, GPUS = 4, 8
SCHED = ("batch_sched_delay=0,sched_min_interval=0,bf_continue,bf_interval=1,bf_resolution=1,"
         "bf_max_job_test=100,default_queue_depth=500,partition_job_depth=500,max_rpc_cnt=150")


def compress(jobs: list[TraceJob], span: float, seed: int, accounts: bool = False) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = [j for j in jobs if 0 < j.gpus <= NODES * GPUS]
    t0, t1 = jobs[0].submit_s, jobs[-1].submit_s
    scale = span / max(1.0, t1 - t0)
    work = sum(j.gpus * j.duration_s for j in jobs)
    run_scale = 0.9 * NODES * GPUS * span / work
    names: dict[str, str] = {}
    out = []
    for j in jobs:
        account = names.setdefault(j.user, f"u{len(names) + 1}") if accounts else "lab"
        run = min(span / 3, max(2.0, j.duration_s * run_scale))
        limit = math.ceil(run * 10 ** rng.uniform(0.0, 1.0) / 60.0) * 60.0
        out.append(TraceJob(j.id, account, round((j.submit_s - t0) * scale, 2), j.gpus, round(run, 1), limit))
    return out


def sh(*cmd: str, env: dict | None = None) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout


def start_lab(accounts: list[str], debug: bool = False) -> dict:
    env = {**os.environ, "LAB": str(LAB), "NODES": str(NODES), "GPUS": str(GPUS), "PROFILE": "fast",
           "SCHED_PARAMS": SCHED, "FRESH": "1", "ACCOUNTING": "dbd"}
    subprocess.run([str(TOOLS / "stop-slurm.sh")], env=env, capture_output=True)
    subprocess.run([str(TOOLS / "start-slurm.sh")], env=env, check=True, capture_output=True)
    env["SLURM_CONF"] = str(LAB / "etc" / "slurm.conf")
    for _ in range(120):
        idle = sh("sinfo", "-h", "-o", "%T %D", env=env)
        if "idle" in idle and str(NODES) in idle:
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"the lab did not come up: {idle}")
    if debug:  # every backfill decision, with its node map, in $LAB/log/slurmctld.log
        with open(LAB / "etc" / "slurm.conf", "a") as fh:
            fh.write("DebugFlags=Backfill,BackfillMap\nSlurmctldDebug=debug\n")
        sh("scontrol", "reconfigure", env=env)
    if accounts:
        with open(LAB / "etc" / "slurm.conf", "a") as fh:
            fh.write("PriorityCalcPeriod=1\nPriorityFlags=NO_FAIR_TREE\n")
        sh("scontrol", "reconfigure", env=env)
        sh("sacctmgr", "-i", "add", "account", ",".join(accounts), "Description=trace", "Organization=trace", env=env)
        sh("sacctmgr", "-i", "add", "user", "root", f"Account={','.join(accounts)}", env=env)
        config = sh("scontrol", "show", "config", env=env)
        if "NO_FAIR_TREE" not in config:
            raise RuntimeError("the lab did not take PriorityFlags=NO_FAIR_TREE")
    return env


def watch_priorities(env: dict, t0: float, log: list[str], stop: threading.Event, every: float = 15.0) -> None:
    """Every ``every`` seconds, Slurm's own view of fair share and pending priorities (sshare,
    sprio), so a run shows which factor put a job where."""
    while not stop.wait(every):
        at = f"{time.time() - t0:.0f}"
        try:
            share = sh("sshare", "-h", "-P", "-a", "-o", "Account,User,NormShares,RawUsage,EffectvUsage,FairShare", env=env)
            prio = sh("sprio", "-h", "-o", "%i|%u|%Y|%A|%F|%J|%P", env=env)
        except subprocess.CalledProcessError:
            continue
        log.extend(f"{at}|sshare|{line}" for line in share.splitlines())
        log.extend(f"{at}|sprio|{line}" for line in prio.splitlines())


def run_on_slurm(jobs: list[TraceJob], env: dict, priority_log: list[str] | None = None
                 ) -> dict[str, tuple[float, float, str]]:
    """Submit each job at its compressed time; return job id -> (submit, start, nodes) with
    times in seconds from the first submission, as sacct records them. With ``priority_log``,
    Slurm's sshare and sprio are sampled into it during the run."""
    ids: dict[str, str] = {}
    t0 = time.time()
    stop = threading.Event()
    if priority_log is not None:
        threading.Thread(target=watch_priorities, args=(env, t0, priority_log, stop), daemon=True).start()
    for job in jobs:
        delay = t0 + job.submit_s - time.time()
        if delay > 0:
            time.sleep(delay)
        nodes = max(1, math.ceil(job.gpus / GPUS))
        per_node = job.gpus if nodes == 1 else GPUS  # whole nodes above one node, as the simulator does
        charge = ["-A", job.user, "--ntasks-per-node=1", f"--cpus-per-task={max(1, per_node)}"] if job.user != "lab" else []
        out = sh("sbatch", "--parsable", "-o", "/dev/null", "-N", str(nodes), f"--gres=gpu:{per_node}", *charge,
                 f"--time={int(job.time_limit_s // 60)}", "--wrap", f"sleep {job.duration_s}", env=env)
        ids[out.strip().split(";")[0]] = job.id
    deadline = time.time() + 3600
    while time.time() < deadline:
        if not sh("squeue", "-h", "-o", "%i", env=env).split():
            break
        time.sleep(1)
    stop.set()
    time.sleep(3)  # let slurmdbd catch up
    rows = sh("sacct", "-X", "-n", "-P", "-o", "JobID,Submit,Start,NodeList", "-j", ",".join(ids), env=env)
    base = None
    out: dict[str, tuple[float, float, str]] = {}
    for line in rows.splitlines():
        slurm_id, submit, start, nodes = line.split("|")
        if slurm_id not in ids or start in ("Unknown", "None"):
            continue
        s, b = datetime.fromisoformat(submit).timestamp(), datetime.fromisoformat(start).timestamp()
        base = s if base is None else min(base, s)
        out[ids[slurm_id]] = (s, b, nodes)
    return {k: (s - base, b - base, nodes) for k, (s, b, nodes) in out.items()}


def recorded(path: Path, jobs: list[TraceJob]) -> dict[str, tuple[float, float, str]]:
    """A run written by this script: job id -> (submit, start, nodes), checked against ``jobs``."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    by_id = {j.id: j for j in jobs}
    strangers = [r["job_id"] for r in rows if r["job_id"] not in by_id or r["account"] != by_id[r["job_id"]].user
                 or abs(float(r["submit_s"]) - by_id[r["job_id"]].submit_s) > 0.01]
    if strangers or not rows:
        raise SystemExit(f"{path}: not a run of these jobs (e.g. {strangers[:3]}); give the run's --jobs/--span/--seed/--accounts")
    return {r["job_id"]: (float(r["submit_s"]), float(r["slurm_start_s"]), r.get("slurm_nodes", "")) for r in rows}


def lab_policy() -> Policy:
    """The lab's slurm.conf as corral's slurm model: same weights, backfill over 100 jobs."""
    return Policy("slurm", PriorityWeights(age=1000, fair_share=10000, job_size=100, partition=1000, qos=0,
                                           max_age_s=7 * 86400, favor_small=False),
                  backfill=True, max_reservations=100, max_backfill_jobs=100, packing="first_fit")


def kendall_tau(a: list[float], b: list[float]) -> float:
    concordant = discordant = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            if x * y > 0:
                concordant += 1
            elif x * y < 0:
                discordant += 1
    return (concordant - discordant) / max(1, concordant + discordant)


def pearson(a: list[float], b: list[float]) -> float:
    return statistics.correlation(a, b) if len(a) > 2 and statistics.pstdev(a) and statistics.pstdev(b) else float("nan")


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = float(rank)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="philly-pollux.csv")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--span", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accounts", action="store_true", help="one Slurm account per trace user (fair share)")
    parser.add_argument("--debug", action="store_true",
                        help="log Slurm's backfill decisions (DebugFlags=Backfill,BackfillMap) to $LAB/log/slurmctld.log")
    parser.add_argument("--replay", type=Path, help="compare with this recorded run instead of running Slurm")
    args = parser.parse_args()
    if not TOOLS.is_dir() and not args.replay:
        sys.exit(f"slurm_fidelity: no slurm-lab at {TOOLS}; it runs a real Slurm from the shared tools beside the "
                 "checkout (--replay CSV rescores a recorded run without it)")
    trace = ROOT.parent / "shared" / "traces" / args.trace
    jobs = compress(load_trace(trace, args.jobs, args.seed), args.span, args.seed, args.accounts)
    accounts = sorted({j.user for j in jobs} - {"lab"})
    print(f"{len(jobs)} jobs of {args.trace}, compressed to {args.span:g} s of submissions; "
          f"{NODES} nodes x {GPUS} GPUs, {len(accounts) or 1} account(s)", flush=True)

    period = 60.0 if accounts else 300.0  # the lab's PriorityCalcPeriod
    sim = simulate(jobs, cluster(NODES, GPUS), lab_policy(), bf_interval_s=1.0, half_life_s=86400.0,
                   priority_calc_s=period, usage_every_s=period)
    sim_start = {o.job.id: o.start for o in sim.outcomes}

    priority_log: list[str] | None = [] if accounts else None
    if args.replay:
        real = recorded(args.replay, jobs)
    else:
        env = start_lab(accounts, args.debug)
        try:
            real = run_on_slurm(jobs, env, priority_log)
        finally:
            subprocess.run([str(TOOLS / "stop-slurm.sh")], env={**os.environ, "LAB": str(LAB)}, capture_output=True)
    by_id = {j.id: j for j in jobs}
    common = [k for k in real if k in sim_start]
    real_wait = [real[k][1] - real[k][0] for k in common]
    sim_wait = [sim_start[k] - by_id[k].submit_s for k in common]
    real_start = [real[k][1] for k in common]
    sim_starts = [sim_start[k] for k in common]
    result = {
        "trace": args.trace, "jobs": len(jobs), "accounts": len(accounts) or 1, "compared": len(common), "span_s": args.span,
        "kendall_tau_start_order": round(kendall_tau(real_start, sim_starts), 3),
        "pearson_wait": round(pearson(real_wait, sim_wait), 3),
        "spearman_wait": round(pearson(ranks(real_wait), ranks(sim_wait)), 3),
        "slurm_mean_wait_s": round(statistics.fmean(real_wait), 1),
        "sim_mean_wait_s": round(statistics.fmean(sim_wait), 1),
        "slurm_p50_wait_s": round(statistics.median(real_wait), 1),
        "sim_p50_wait_s": round(statistics.median(sim_wait), 1),
        "within_5s": round(sum(abs(a - b) < 5 for a, b in zip(real_start, sim_starts)) / max(1, len(common)), 3),
    }
    if args.replay:  # a real run is recorded once; replays only print
        print(json.dumps({**result, "replayed_from": args.replay.name}, indent=2))
        return
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    at = datetime.now().isoformat(timespec="seconds")
    with open(out / "slurm_fidelity.jsonl", "a") as fh:
        fh.write(json.dumps({**result, "at": at}) + "\n")
    if priority_log:  # Slurm's factors during the run, with the Slurm job ids (= index + 1 on a fresh lab)
        (out / f"slurm_fidelity_prio_{at.replace(':', '')}.txt").write_text("\n".join(priority_log) + "\n")
    # job by job, to see where the two schedules part
    with open(out / f"slurm_fidelity_jobs_{at.replace(':', '')}.csv", "w") as fh:
        fh.write("job_id,account,gpus,run_s,limit_s,submit_s,slurm_start_s,sim_start_s,slurm_nodes\n")
        for k in common:
            j = by_id[k]
            fh.write(f"{k},{j.user},{j.gpus},{j.duration_s},{j.time_limit_s},{j.submit_s},{real[k][1]:.1f},"
                     f"{sim_start[k]:.2f},\"{real[k][2]}\"\n")


if __name__ == "__main__":
    main()
