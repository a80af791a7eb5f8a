#!/usr/bin/env python3
"""Listing jobs when the store holds a long history: ``GET /v1/jobs`` over HTTP against a
real server whose database holds ``--jobs`` ended jobs (plus a small live queue), beside the
same query run directly on the database in the same run (the floor the API adds to).

  python bench/api.py [--jobs 100000] [--samples 50] [--pg postgresql+psycopg://…] [--json]

Queries: the live queue (what ``corral queue`` asks), the newest page of the history (``--all``),
a filtered one (a user's FAILED jobs, 100 per page), and a page deep in the history by cursor.
SQLite always; PostgreSQL too with ``--pg`` (its schema is dropped and made again).
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


def fill(url: str, n: int) -> None:
    """``n`` ended jobs (one in ten FAILED) and 20 held pending ones, written in bulk."""
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
        held = [NewJob(spec.model_copy(update={"name": f"live{i}"}), USERS[i % len(USERS)]) for i in range(20)]
        repository.create_jobs(s, held, time.time())
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


def measure(url: str, n: int, samples: int) -> dict[str, dict[str, float]]:
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
    fill(url, n)
    print(f"  filled {n} jobs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
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
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--pg", help="a PostgreSQL URL to measure too (its public schema is dropped)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {"sqlite": measure("sqlite", args.jobs, args.samples)}
    if args.pg:
        results["postgresql"] = measure(args.pg, args.jobs, args.samples)
    if args.json:
        print(json.dumps({"jobs": args.jobs, "samples": args.samples, "results": results}, indent=1))
        return
    print(f"GET /v1/jobs with {args.jobs} ended jobs in the store, {args.samples} samples each")
    print(f"{'store':<11} {'query':<27} {'rows':>5} {'API p50':>9} {'API p99':>9} {'DB alone p50':>13}")
    for store, rows in results.items():
        for label, r in rows.items():
            print(f"{store:<11} {label:<27} {r['rows']:>5} {r['api_p50_ms']:>7.1f}ms {r['api_p99_ms']:>7.1f}ms "
                  f"{r['db_p50_ms']:>11.1f}ms")
    (ROOT / "bench" / "results" / "api.json").write_text(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                                     "jobs": args.jobs, "results": results}, indent=1))


if __name__ == "__main__":
    main()
