#!/usr/bin/env python3
"""Speed of one full scheduling cycle of the pure scheduler.

  python bench/scheduler.py [--nodes 1000] [--pending 1000 10000 50000] [--policy corral] [--json]
  python bench/scheduler.py --nodes 10000 --pending 50000 --against 94325c0 [--rounds 5] [--out FILE]

Cluster: N nodes x 8 GPUs, 8 nodes per leaf, half of the GPUs busy with running jobs whose
time limits end at spread-out times (so backfill has reservations to respect). Queue: gangs
of 1-64 GPUs (multi-node above 8, placed under the fewest leaf switches), 10 % of them
two-task job groups, 50 users in 10 accounts with some usage, seeded. One cycle is
timed in CPU seconds (the best of ``--repeat`` runs of it, 3 by default: the first also pays
for warming up); every priority is computed in the cycle (the control loop reuses them for a
few seconds, so this is its costliest cycle). Placements per CPU-second = starts / cycle CPU
time. The baseline printed beside it is strict FIFO on the same snapshot (the cheapest
possible policy), and the published reference points: kube-scheduler's scheduler_perf
thresholds 680-810 pods/s on 5,000 nodes, Kueue's suite ~42 admissions/s.

``--against REF`` measures the scheduler of git ref REF (checked out in a temporary
worktree) with this same script and world, side by side: each of ``--rounds`` rounds runs
REF and then this tree in fresh processes, one after the other, so both see the same
machine conditions; it prints both figures per size and their ratio (the median over the
rounds of REF's cycle CPU / this tree's). The machine's speed varies between runs; the ratio
is the figure to read. Both must make the same number of starts (the same decisions).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


ABSENT = "B200"  # --absent-type: a GPU type the bench's (untyped) nodes do not have


def build(nodes: int, pending: int, seed: int = 0, gpu_type: str | None = None):
    from corral.scheduler import NodeView, PendingJob, Snapshot, TaskRequest
    from corral.scheduler.placement import FreePool, place_gang
    from corral.scheduler.snapshot import RunningJob

    rng = random.Random(seed)
    views = [NodeView(f"n{i:05d}", 8, 64, 512, None, (("leaf", f"leaf{i // 8}"),)) for i in range(nodes)]
    pool = FreePool(views)
    running = []
    busy_target = nodes * 8 // 2
    busy, job_id = 0, 10_000_000
    while busy < busy_target:
        gpus = rng.choice([1, 2, 4, 8])
        allocs = place_gang(pool, PendingJob(job_id, (TaskRequest("t", 1, gpus, 1.0),)))
        if allocs is None:
            break
        running.append(RunningJob(job_id, allocs, rng.uniform(60, 86400)))
        busy += gpus
        job_id += 1
    jobs = []
    for i in range(pending):
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64])
        task = TaskRequest("main", max(1, gpus // 8), min(gpus, 8), 1.0, gpu_type=gpu_type)
        tasks = (task, TaskRequest("reward", 1, 0, 1.0)) if rng.random() < 0.1 else (task,)
        jobs.append(PendingJob(i, tasks, float(i), f"u{i % 50}", f"a{i % 10}", rng.uniform(300, 86400 * 2)))
    free = pool.views()
    usage = {(f"a{i % 10}", f"u{i}"): float(i) for i in range(50)}
    return Snapshot(free, tuple(jobs), tuple(running), usage)


def cycle(snapshot, policy, repeat: int = 3) -> tuple[float, int]:
    """The best of ``repeat`` runs of the same cycle (the first also pays for warming up)."""
    from corral.scheduler import schedule

    best, starts = float("inf"), 0
    for _ in range(repeat):
        t0 = time.process_time()
        plan = schedule(snapshot, 0.0, policy)
        best, starts = min(best, time.process_time() - t0), len(plan.starts)
    return best, starts


def measure(nodes: int, sizes: list[int], policy_name: str, repeat: int, gpu_type: str | None = None) -> list[dict]:
    """One row per queue length, with the scheduler importable as ``corral`` (sys.path)."""
    from corral.scheduler import Policy

    rows = []
    for pending in sizes:
        snapshot = build(nodes, pending, gpu_type=gpu_type)
        # topology on: multi-node gangs go under the fewest leaf switches
        cpu, starts = cycle(snapshot, Policy.named(policy_name, topology=("leaf",)), repeat)
        fifo_cpu, fifo_starts = cycle(snapshot, Policy.named("fifo"), repeat)
        rows.append({"nodes": nodes, "pending": pending, "policy": policy_name, "cycle_cpu_s": round(cpu, 4),
                     "starts": starts, "placements_per_cpu_s": round(starts / cpu, 1) if cpu else None,
                     "fifo_cycle_cpu_s": round(fifo_cpu, 4), "fifo_starts": fifo_starts})
    return rows


def _worker(root: Path, args: argparse.Namespace, sizes: list[int]) -> list[dict]:
    """``measure`` in a fresh process that imports the scheduler from ``root``."""
    command = [sys.executable, str(HERE), "--worker", str(root), "--nodes", str(args.nodes), "--policy", args.policy,
               "--repeat", str(args.repeat), *(["--absent-type"] if args.absent_type else []),
               "--pending", *map(str, sizes)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=root)
    return json.loads(out.stdout)


def against(args: argparse.Namespace) -> dict:
    sha = subprocess.run(["git", "rev-parse", "--short", args.against], check=True, capture_output=True, text=True,
                         cwd=REPO).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "corral"], capture_output=True, text=True,
                                cwd=REPO).stdout.strip())
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        ref_root = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(ref_root), sha], check=True, cwd=REPO)
        try:
            for n in range(args.rounds):
                ref_rows = _worker(ref_root, args, args.pending)
                new_rows = _worker(REPO, args, args.pending)
                rounds.append({"round": n, "ref": ref_rows, "new": new_rows})
                if not args.json:
                    print(f"  round {n + 1}/{args.rounds}: " + ", ".join(
                        f"{r['pending']}: {r['cycle_cpu_s']:.3f} -> {w['cycle_cpu_s']:.3f} CPU-s"
                        for r, w in zip(ref_rows, new_rows)), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref_root)], cwd=REPO)
    summary = []
    for i, pending in enumerate(args.pending):
        ref = [r["ref"][i] for r in rounds]
        new = [r["new"][i] for r in rounds]
        if {x["starts"] for x in ref} != {x["starts"] for x in new}:
            raise SystemExit(f"{pending} pending: {ref[0]['starts']} starts at {sha}, {new[0]['starts']} here: "
                             "the two trees do not decide alike")
        ratios = [a["cycle_cpu_s"] / b["cycle_cpu_s"] for a, b in zip(ref, new)]
        summary.append({"nodes": args.nodes, "pending": pending, "policy": args.policy, "starts": new[0]["starts"],
                        "ref_cycle_cpu_s": statistics.median(x["cycle_cpu_s"] for x in ref),
                        "new_cycle_cpu_s": statistics.median(x["cycle_cpu_s"] for x in new),
                        "ref_best_cpu_s": min(x["cycle_cpu_s"] for x in ref),
                        "new_best_cpu_s": min(x["cycle_cpu_s"] for x in new),
                        "ratio_median": round(statistics.median(ratios), 2),
                        "ratio_min": round(min(ratios), 2), "ratio_max": round(max(ratios), 2),
                        "new_fifo_cycle_cpu_s": statistics.median(x["fifo_cycle_cpu_s"] for x in new)})
    return {"command": "python bench/scheduler.py " + " ".join(sys.argv[1:]), "ref": sha,
            "head": head + ("+changes" if dirty else ""), "rounds": args.rounds, "repeat": args.repeat,
            "load_average_before": args.load, "summary": summary, "per_round": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--policy", default="corral", choices=["slurm", "corral"])
    parser.add_argument("--repeat", type=int, default=3, help="cycles per measurement; the best counts")
    parser.add_argument("--against", metavar="REF", help="also measure the scheduler at this git ref")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: REF-then-this rounds")
    parser.add_argument("--out", type=Path, help="with --against: also write the result as JSON here")
    parser.add_argument("--absent-type", action="store_true",
                        help="every pending job asks for a GPU type (B200) no node has: the cost of reasons alone")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, value in (("--nodes", args.nodes), ("--repeat", args.repeat), ("--rounds", args.rounds),
                        *(("--pending", p) for p in args.pending)):
        if value < 1:
            parser.error(f"{name} must be at least 1, not {value}")
    if args.worker is not None:
        sys.path.insert(0, str(args.worker))
        import corral

        if not Path(corral.__file__).resolve().is_relative_to(args.worker.resolve()):
            raise SystemExit(f"corral was imported from {corral.__file__}, not from {args.worker}")
        print(json.dumps(measure(args.nodes, args.pending, args.policy, args.repeat, ABSENT if args.absent_type else None)))
        return
    if args.against:
        args.load = round(os.getloadavg()[0], 2)
        if not args.json:
            print(f"one full cycle, {args.nodes} nodes x 8 GPUs (half busy), policy {args.policy}: "
                  f"{args.against} against this tree, {args.rounds} rounds (load average {args.load})")
        result = against(args)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        if args.json:
            print(json.dumps(result, indent=2))
            return
        for r in result["summary"]:
            print(f"  {r['pending']:6d} pending: {result['ref']} {r['ref_cycle_cpu_s']:7.3f} CPU-s, "
                  f"this tree {r['new_cycle_cpu_s']:7.3f} CPU-s (medians), {r['ratio_median']:.1f}x less CPU "
                  f"(rounds {r['ratio_min']:.1f}-{r['ratio_max']:.1f}x), {r['starts']} starts each")
        return
    sys.path.insert(0, str(REPO))
    rows = measure(args.nodes, args.pending, args.policy, args.repeat, ABSENT if args.absent_type else None)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"one full cycle, {args.nodes} nodes x 8 GPUs (half busy), policy {args.policy}; baseline strict FIFO")
    for r in rows:
        print(f"  {r['pending']:6d} pending: {r['cycle_cpu_s']:7.3f} CPU-s, {r['starts']:5d} starts, "
              f"{r['placements_per_cpu_s']} placements/CPU-s   (fifo: {r['fifo_cycle_cpu_s']} CPU-s, "
              f"{r['fifo_starts']} starts)")


if __name__ == "__main__":
    main()
