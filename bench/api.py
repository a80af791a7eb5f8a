#!/usr/bin/env python3
"""Listing jobs when the store holds a long history: ``GET /v1/jobs`` over HTTP against a
real server whose database holds ``--jobs`` ended jobs (plus a live queue of ``--live`` held
jobs and 8 running ones), beside the same query run directly on the database in the same run
(the floor the API adds to); and the wall time of ``corral queue`` on that store, beside the
bare interpreter's start-up (``python -c pass``) measured alternately in the same run.

  python bench/api.py [--jobs 100000] [--live 20] [--samples 50] [--cli-samples 5]
                      [--pg postgresql+psycopg://…] [--json]

Queries: the live queue (what ``corral queue --json`` asks, a page), the newest page of the
history (``--all``), a filtered one (a user's FAILED jobs, 100 per page), and a page deep in
the history by cursor. Commands: ``corral queue`` (its default view), ``corral queue --all``
(every live job) and ``corral queue --json``, output piped; the lines each printed are counted.
SQLite always; PostgreSQL too with ``--pg`` (its schema is dropped and made again).
``--jobs 10000 --live 40000`` is a store of 50,000 jobs, 40,000 of them in the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, select, text, update  # noqa: E402

from corral import embedded as daemon  # noqa: E402
from corral.client import Client  # noqa: E402
from corral.settings import Settings  # noqa: E402
from corral.spec import load_job  # noqa: E402
from corral.store import repository  # noqa: E402
from corral.store.database import make_engine, migrate, session_factory  # noqa: E402
from corral.store.repository import NewJob  # noqa: E402
from corral.store.tables import Job  # noqa: E402
from corral.credentials import read_local_token  # noqa: E402

POOL = "nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 64\n    memory: 512\n"
USERS = [f"u{i}" for i in range(10)]


def fill(url: str, n: int, live: int = 20) -> None:
    """``n`` ended jobs (one in ten FAILED) and ``live`` held pending ones, written in bulk."""
    engine = make_engine(url)
    migrate(engine)
    sessions = session_factory(engine)
    spec = load_job("run: 'true'\nresources: {accelerators: H100:1}\n").spec
    now = time.time() - n
    with sessions() as s:
        for start in range(0, n, 2000):
            batch = [NewJob(spec.model_copy(update={"name": f"j{i}"}), USERS[i % len(USERS)])
                     for i in range(start, min(n, start + 2000))]
            repository.create_jobs(s, batch, now + start)
            s.commit()
        s.execute(update(Job).values(state="SUCCEEDED", ended_at=now + n, started_at=now, exit_code=0))
        s.execute(update(Job).where(Job.id % 10 == 3).values(state="FAILED", exit_code=1))
        s.commit()
        for start in range(0, live, 2000):
            held = [NewJob(spec.model_copy(update={"name": f"live{i}"}), USERS[i % len(USERS)])
                    for i in range(start, min(live, start + 2000))]
            repository.create_jobs(s, held, time.time())
            s.commit()
        s.execute(update(Job).where(Job.name.like("live%")).values(hold="user", reason="JobHeldUser"))
        s.commit()
    engine.dispose()


QUERIES = {
    "live queue": ({}, lambda q, middle: q.where(Job.state.in_(["PENDING", "STARTING", "RUNNING", "PREEMPTED"]))
                   .order_by(Job.id).limit(1000)),
    "history, newest 1000": ({"all": True}, lambda q, middle: q.order_by(Job.id.desc()).limit(1000)),
    "u2's FAILED, 100": ({"user": "u2", "states": ["FAILED"], "limit": 100},
                          lambda q, middle: q.where(Job.user == "u2", Job.state == "FAILED").order_by(Job.id).limit(100)),
    "cursor page at the middle": ({"all": True, "after": None, "limit": 1000},  # after: the middle id
                                  lambda q, middle: q.where(Job.id > middle).order_by(Job.id).limit(1000)),
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


RUNNING = "name: run{i}\nresources: {{accelerators: H100:1}}\nrun: sleep 3600\n"
COMMANDS = {"corral queue": ["queue"], "corral queue --all": ["queue", "--all"], "corral queue --json": ["queue", "--json"]}


def commands(env: dict[str, str], samples: int) -> dict[str, dict[str, float]]:
    """Wall time of each command (output piped), alternating with the bare interpreter's."""
    import subprocess

    out: dict[str, dict[str, float]] = {}
    base: list[float] = []
    for label, args in COMMANDS.items():
        times, lines = [], 0
        for _ in range(samples):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=env, capture_output=True,
                                  check=True, timeout=600)
            times.append(time.perf_counter() - t)
            lines = done.stdout.count(b"\n")
        out[label] = {"lines": lines, "p50_s": statistics.median(times), "max_s": max(times)}
    out["python -c pass"] = {"lines": 0, "p50_s": statistics.median(base), "max_s": max(base)}
    return out


def measure(url: str, n: int, samples: int, live: int = 20, cli_samples: int = 0) -> dict[str, dict[str, float]]:
    home = Path(tempfile.mkdtemp(prefix="corral-bench-api-"))
    (home / "config.yaml").write_text(POOL)
    if url == "sqlite":
        url = f"sqlite:///{home / 'corral.db'}"
    else:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
    t0 = time.perf_counter()
    fill(url, n, live)
    print(f"  filled {n} ended and {live} live jobs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    middle = n // 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), CORRAL_DB_URL=url)
    settings = Settings.from_env(env)
    os.environ.update(CORRAL_DB_URL=url)  # daemon.start passes the environment on
    info = daemon.start(settings)
    engine = make_engine(url)
    out: dict[str, dict[str, float]] = {}
    try:
        with Client(info["url"], read_local_token(settings.home), timeout=120) as client, engine.connect() as conn:
            running = [client.submit(RUNNING.format(i=i))["job"]["id"] for i in range(8)]  # the node's 8 GPUs
            for job_id in running:
                client.wait(job_id, states=("RUNNING",), timeout=120)
            if cli_samples:
                out.update(commands(env, cli_samples))
            for label, (params, sql) in QUERIES.items():
                params = dict(params)
                if "after" in params:
                    params["after"] = middle
                api, db, rows = [], [], 0
                for _ in range(samples):
                    t = time.perf_counter()
                    rows = len(client.jobs(**params))
                    api.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    conn.execute(sql(select(Job), middle)).all()
                    db.append(time.perf_counter() - t)
                out[label] = {"rows": rows, "api_p50_ms": statistics.median(api) * 1000, "api_p99_ms": pct(api, 99) * 1000,
                              "db_p50_ms": statistics.median(db) * 1000}
    finally:
        engine.dispose()
        daemon.stop(settings)
        os.environ.pop("CORRAL_DB_URL", None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=20, help="held pending jobs in the queue (8 more run)")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--cli-samples", type=int, default=0, help="time the corral queue commands this many times")
    parser.add_argument("--pg", help="a PostgreSQL URL to measure too (its public schema is dropped)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {"sqlite": measure("sqlite", args.jobs, args.samples, args.live, args.cli_samples)}
    if args.pg:
        results["postgresql"] = measure(args.pg, args.jobs, args.samples, args.live, args.cli_samples)
    setup = {"jobs": args.jobs, "live": args.live + 8, "samples": args.samples, "cli_samples": args.cli_samples}
    if args.json:
        print(json.dumps({**setup, "results": results}, indent=1))
        return
    print(f"GET /v1/jobs with {args.jobs} ended and {args.live + 8} live jobs in the store, {args.samples} samples each")
    print(f"{'store':<11} {'query':<27} {'rows':>5} {'API p50':>9} {'API p99':>9} {'DB alone p50':>13}")
    for store, rows in results.items():
        for label, r in rows.items():
            if "rows" in r:
                print(f"{store:<11} {label:<27} {r['rows']:>5} {r['api_p50_ms']:>7.1f}ms {r['api_p99_ms']:>7.1f}ms "
                      f"{r['db_p50_ms']:>11.1f}ms")
    if args.cli_samples:
        print(f"\ncommands, output piped, {args.cli_samples} samples each (wall time)")
        print(f"{'store':<11} {'command':<22} {'lines':>6} {'p50':>8} {'max':>8}")
        for store, rows in results.items():
            for label, r in rows.items():
                if "lines" in r:
                    print(f"{store:<11} {label:<22} {r['lines']:>6} {r['p50_s']:>7.2f}s {r['max_s']:>7.2f}s")
    (ROOT / "bench" / "results" / "api.json").write_text(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                                     **setup, "results": results}, indent=1))


if __name__ == "__main__":
    main()
