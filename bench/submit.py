"""Submission throughput: how many job submissions a corral server accepts per second from
concurrent clients, with latency percentiles, and that every accepted job is stored once.

  python bench/submit.py [--clients 16] [--jobs 2000] [--pg postgresql+psycopg://…]

Starts a server in a temporary CORRAL_HOME (SQLite; with ``--pg``, a second run against
that database, whose tables are dropped first), sends ``--jobs`` one-replica submissions from
``--clients`` threads (each its own HTTP connection), and prints accepted submissions per
second, p50/p99 latency, and stored vs accepted. (``sbatch`` on slurm-lab accepted about
250-290 submissions/s on this VM kind, measured before; a side-by-side run with slurm-lab is
not part of this script yet.)"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

POOL = "nodes:\n  - {name: n, count: 4, gpus: 8, cpus: 64, memory: 512}\n"


def run(clients: int, jobs: int, db_url: str | None) -> dict:
    home = Path(tempfile.mkdtemp(prefix="corral-bench-submit-"))
    (home / "config.yaml").write_text(POOL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    if db_url:
        from sqlalchemy import create_engine, text

        engine = create_engine(db_url)
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
        env["CORRAL_DB_URL"] = db_url
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    url = json.loads((home / "server.json").read_text())["url"]
    latencies: list[float] = []
    accepted: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(jobs))

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for i in counter:
                body = {"yaml": f"name: s{i}\nrun: 'true'\n"}
                t0 = time.perf_counter()
                try:
                    response = http.post("/v1/jobs", json=body)
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(type(exc).__name__)
                    continue
                elapsed = time.perf_counter() - t0
                with lock:
                    latencies.append(elapsed)
                    if response.status_code == 201:
                        accepted.append(response.json()["job"]["id"])
                    else:
                        errors.append(str(response.status_code))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    stored = httpx.get(url + "/v1/jobs", params={"all": "true", "limit": 10000}, timeout=120).json()
    subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
    ordered = sorted(latencies)
    ids = [j["id"] for j in stored]
    return {"db": "postgresql" if db_url else "sqlite", "clients": clients, "accepted": len(accepted),
            "accepted_per_s": round(len(accepted) / wall, 1), "p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1), "errors": len(errors),
            "stored": len(ids), "stored_once": len(ids) == len(set(ids)) and set(accepted) <= set(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--pg", help="also run against this PostgreSQL URL (its public schema is dropped)")
    args = parser.parse_args()
    results = [run(args.clients, args.jobs, None)]
    if args.pg:
        results.append(run(args.clients, args.jobs, args.pg))
    print("| database | clients | accepted/s | p50 | p99 | stored once |\n| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['db']} | {r['clients']} | {r['accepted_per_s']} | {r['p50_ms']} ms | {r['p99_ms']} ms | "
              f"{r['stored_once']} ({r['stored']} stored, {r['accepted']} accepted, {r['errors']} errors) |")
    out = Path(__file__).resolve().parent / "results" / "submit.json"
    out.write_text(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": results}, indent=1))


if __name__ == "__main__":
    main()
