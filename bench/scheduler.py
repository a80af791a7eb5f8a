#!/usr/bin/env python3
"""Speed of one full scheduling cycle of the pure scheduler.

  python bench/scheduler.py [--nodes 1000] [--pending 1000 10000 50000] [--policy corral] [--json]

Cluster: N nodes x 8 GPUs, 8 nodes per leaf, half of the GPUs busy with running jobs whose
time limits end at spread-out times (so backfill has reservations to respect). Queue: gangs
of 1-64 GPUs (multi-node above 8, placed under the fewest leaf switches), 10 % of them
two-task job groups, 50 users in 10 accounts with some usage, seeded. One cycle is
timed in CPU seconds (the best of three runs of it); placements per CPU-second = starts /
cycle CPU time. The baseline
printed beside it is strict FIFO on the same snapshot (the cheapest possible policy), and
the published reference points: kube-scheduler's scheduler_perf thresholds 680-810 pods/s
on 5,000 nodes, Kueue's suite ~42 admissions/s.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corral.scheduler import NodeView, PendingJob, Policy, Snapshot, TaskRequest, schedule  # noqa: E402
from corral.scheduler.placement import FreePool, place_gang  # noqa: E402
from corral.scheduler.snapshot import RunningJob  # noqa: E402


def build(nodes: int, pending: int, seed: int = 0) -> Snapshot:
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
        task = TaskRequest("main", max(1, gpus // 8), min(gpus, 8), 1.0)
        tasks = (task, TaskRequest("reward", 1, 0, 1.0)) if rng.random() < 0.1 else (task,)
        jobs.append(PendingJob(i, tasks, float(i), f"u{i % 50}", f"a{i % 10}", rng.uniform(300, 86400 * 2)))
    free = pool.views()
    usage = {(f"a{i % 10}", f"u{i}"): float(i) for i in range(50)}
    return Snapshot(free, tuple(jobs), tuple(running), usage)


def cycle(snapshot: Snapshot, policy: Policy, repeat: int = 3) -> tuple[float, int]:
    """The best of ``repeat`` runs of the same cycle (the first also pays for warming up)."""
    best, starts = float("inf"), 0
    for _ in range(repeat):
        t0 = time.process_time()
        plan = schedule(snapshot, 0.0, policy)
        best, starts = min(best, time.process_time() - t0), len(plan.starts)
    return best, starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--policy", default="corral", choices=["slurm", "corral"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for pending in args.pending:
        snapshot = build(args.nodes, pending)
        # topology on: multi-node gangs go under the fewest leaf switches
        cpu, starts = cycle(snapshot, Policy.named(args.policy, topology=("leaf",)))
        fifo_cpu, fifo_starts = cycle(snapshot, Policy.named("fifo"))
        rows.append({"nodes": args.nodes, "pending": pending, "policy": args.policy, "cycle_cpu_s": round(cpu, 3),
                     "starts": starts, "placements_per_cpu_s": round(starts / cpu, 1) if cpu else None,
                     "fifo_cycle_cpu_s": round(fifo_cpu, 4), "fifo_starts": fifo_starts})
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
