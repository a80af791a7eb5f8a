#!/usr/bin/env python3
"""What learned run times cost the server's scheduling pass.

  python bench/runtimes.py [--nodes 1000] [--pending 50000] [--seed-rows 100000] [--json]

The queue: ``--pending`` jobs of 50 users, each job one of 200 names and 1-64 GPUs, with time
limits of 5 min to 2 days; every (user, name, GPUs) has history (the model is fed five runs
each), so every job gets a prediction. The cluster is bench/scheduler.py's: ``--nodes`` x 8
GPUs, half busy with running jobs.

Timed in CPU seconds (best of ``--repeat``), one pass as the control loop runs it: the pending
jobs' requests handed to the scheduler (``RunTimes.requests``), then ``schedule``:

* baseline — the requests as they are, time limits only (corral without this feature);
* shown — predictions computed and published, the policy planning with time limits
  (``learn_durations: false``, the default);
* learned — the policy planning with them (``learn_durations: true``).

The prediction step alone is timed three ways: steady (no job ended since the last pass: a
look-up per job), one end (one user's history changed: that user's jobs predicted again),
and cold (every job predicted: the first pass after a start). ``--seed-rows`` finished jobs in
a SQLite store time the start-up read of history (``RunTimes.seed``)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler import build  # noqa: E402  (bench/scheduler.py: the same cluster)

from corral.control.records import JobRec, TaskRec  # noqa: E402
from corral.control.runtimes import RunTimes, gpus_of  # noqa: E402
from corral.scheduler import Policy, Snapshot, schedule  # noqa: E402
from corral.spec import load_job  # noqa: E402
from corral.states import JobState  # noqa: E402

USERS, NAMES = 50, 200


def queue(pending: int, seed: int = 0) -> list[JobRec]:
    rng = random.Random(seed)
    spec = load_job("name: t\nresources: {accelerators: H100:8}\nrun: echo\n").spec.tasks[0].model_dump(mode="json")
    jobs = []
    for i in range(pending):
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64])
        task = TaskRec(i, "main", True, max(1, gpus // 8), min(gpus, 8), None, 1.0, 0.0, 5.0, 0.0, None, None, spec)
        jobs.append(JobRec(i, f"exp{rng.randrange(NAMES)}", f"u{i % USERS}", False, JobState.PENDING, float(i), False,
                           tasks=[task], account=f"a{i % 10}", time_limit=rng.uniform(300, 86400 * 2)))
    return jobs


def taught(jobs: list[JobRec], use: bool, seed: int = 1) -> RunTimes:
    """A RunTimes whose model has five runs of every (user, name, GPUs) in the queue."""
    rng = random.Random(seed)
    times = RunTimes(use)
    for key in sorted({(j.user, j.name, gpus_of(j)) for j in jobs}):
        for _ in range(5):
            times.model.observe(*key, rng.lognormvariate(8.0, 1.0))
    return times


def best(fn, repeat: int) -> float:  # noqa: ANN001
    out = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        out = min(out, time.process_time() - t0)
    return out


STARTS: dict[str, int] = {}


def counted(label: str, plan) -> None:  # noqa: ANN001 - a Plan
    STARTS[label] = len(plan.starts)


def one_end(times: RunTimes, jobs: list[JobRec], user: str) -> float:
    """The prediction step after one of ``user``'s jobs ended (that user's jobs predicted again)."""
    done = next(j for j in jobs if j.user == user)
    times.model.observe(user, done.name, gpus_of(done), 1234.0)
    times._changed.add(user)  # as ``committed`` marks it
    t0 = time.process_time()
    times.requests(jobs)
    return time.process_time() - t0


def seed_cost(rows: int) -> tuple[int, float]:
    from sqlalchemy import insert

    from corral.store.database import make_engine, migrate, session_factory
    from corral.store.tables import Job, Task

    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/corral.db")
        migrate(engine)
        rng = random.Random(2)
        with engine.begin() as conn:
            conn.execute(insert(Job), [
                {"id": i + 1, "name": f"exp{rng.randrange(NAMES)}", "user": f"u{i % USERS}",
                 "state": rng.choice(["SUCCEEDED", "SUCCEEDED", "TIMEOUT", "FAILED"]), "spec": {},
                 "submitted_at": float(i), "started_at": float(i), "ended_at": float(i) + rng.uniform(60, 86400)}
                for i in range(rows)])
            conn.execute(insert(Task), [
                {"job_id": i + 1, "position": 0, "name": "main", "primary": True, "num_nodes": 1,
                 "gpus": rng.choice([1, 2, 4, 8]), "cpus": 1.0, "grace_period": 5.0} for i in range(rows)])
        sessions = session_factory(engine)
        times = RunTimes(True)
        t0 = time.perf_counter()
        with sessions() as s:
            read = times.seed(s)
        took = time.perf_counter() - t0
        engine.dispose()
    return read, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=50000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed-rows", type=int, default=100000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cluster = build(args.nodes, 0)
    jobs = queue(args.pending)
    for job in jobs:
        job.request  # noqa: B018 - built once, as the loop's records keep it
    off, on = Policy.named("corral", topology=("leaf",)), Policy.named("corral", topology=("leaf",), learn_durations=True)

    def snapshot(requests) -> Snapshot:  # noqa: ANN001
        return Snapshot(cluster.nodes, tuple(requests), cluster.running, cluster.usage)

    result: dict[str, object] = {"nodes": args.nodes, "pending": args.pending}
    schedule(snapshot([j.request for j in jobs]), 0.0, off)  # warm-up: the first pass pays for caches
    learners = {label: taught(jobs, use) for label, use in (("shown", False), ("learned", True))}
    for label, times in learners.items():
        result[f"{label}_cold_predict_cpu_s"] = best(lambda: times.requests(jobs), 1)
        result[f"{label}_steady_predict_cpu_s"] = best(lambda: times.requests(jobs), args.repeat)
        result[f"{label}_one_end_predict_cpu_s"] = one_end(times, jobs, "u7")
        result[f"{label}_predicted"] = len(times.predictions)
    # the three passes interleaved, round after round, the best of each kept: on a shared
    # machine a neighbour's burst then slows one round of all three, not one of them
    passes = {"baseline": (lambda: [j.request for j in jobs], off),
              "shown": (lambda: learners["shown"].requests(jobs), off),
              "learned": (lambda: learners["learned"].requests(jobs), on)}
    for label in passes:
        result[f"{label}_pass_cpu_s"] = float("inf")
    for _ in range(args.repeat):
        for label, (requests, policy) in passes.items():
            took = best(lambda: counted(label, schedule(snapshot(requests()), 0.0, policy)), 1)
            result[f"{label}_pass_cpu_s"] = min(result[f"{label}_pass_cpu_s"], took)
    base = result["baseline_pass_cpu_s"]
    result.update({f"{label}_starts": n for label, n in STARTS.items()})
    for label in ("shown", "learned"):
        result[f"{label}_ratio"] = round(result[f"{label}_pass_cpu_s"] / base, 3)
        result[f"{label}_steady_share"] = round(result[f"{label}_steady_predict_cpu_s"] / base, 4)
    if args.seed_rows:
        result["seed_rows"], result["seed_s"] = seed_cost(args.seed_rows)
    for key, value in result.items():
        if isinstance(value, float):
            result[key] = round(value, 4)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"one scheduling pass, {args.nodes} nodes x 8 GPUs (half busy), {args.pending:,} pending, policy corral")
    print(f"  baseline (time limits, no predictions): {base:.3f} CPU-s, {result['baseline_starts']} starts")
    for label in ("shown", "learned"):
        print(f"  {label:8s}: pass {result[f'{label}_pass_cpu_s']:.3f} CPU-s = {result[f'{label}_ratio']:.3f}x baseline; "
              f"prediction step steady {result[f'{label}_steady_predict_cpu_s']:.4f}, after one end "
              f"{result[f'{label}_one_end_predict_cpu_s']:.4f}, cold {result[f'{label}_cold_predict_cpu_s']:.4f} CPU-s "
              f"({result[f'{label}_predicted']:,} predicted); {result[f'{label}_starts']} starts")
    if args.seed_rows:
        print(f"  start-up: {result['seed_rows']:,} finished runs read from {args.seed_rows:,} stored jobs "
              f"in {result['seed_s']:.3f} s")


if __name__ == "__main__":
    main()
