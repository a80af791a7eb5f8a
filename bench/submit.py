"""Submission throughput: how many job submissions a corral server accepts per second from
concurrent clients, with latency percentiles, that every accepted job is stored exactly once,
and real ``sbatch`` doing the same beside it when slurm-lab runs.

  python bench/submit.py [--clients 16] [--jobs 4000] [--pg postgresql+psycopg://…] [--slurm]

Starts a server in a temporary CORRAL_HOME (SQLite; with ``--pg``, a second run against
that database, whose tables are dropped first) and sends ``--jobs`` one-replica submissions
over ``--clients`` keep-alive HTTP connections. The load comes from a separate process that
speaks HTTP/1.1 on raw asyncio streams, so the client's own cost (a Python HTTP library costs
about as much CPU per request as the server) does not cap what is measured; the server still
parses, validates, admits and stores every job. It prints accepted submissions per second,
p50/p99 latency and stored vs accepted (read back from the database).

With ``--slurm`` (slurm-lab running: ``../shared/tools/slurm-lab/start-slurm.sh``), the same
number of ``sbatch --wrap true`` calls from ``--clients`` threads, the way people script
submissions, measured in the same run. Noisy machine: read the ratios."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corral.credentials import read_local_token

POOL = "nodes:\n  - {name: n, count: 4, gpus: 8, gpu_type: H100, cpus: 64, memory: 512}\n"
# --queued: every GPU is held by one long job first, so the flood waits in the queue (the burst a
# user sends to a busy cluster); otherwise each job starts and ends while the flood goes on.
BLOCKER = "name: blocker\nnum_nodes: 4\nresources: {accelerators: H100:8}\nrun: sleep 3600\n"
SLURM_ENV = Path(os.environ.get("LAB", "/tmp/slurmlab")) / "slurm.env"


async def _load(host: str, port: int, clients: int, jobs: int, queued: bool, token: str) -> tuple[list[float], list[int], list[str], float]:
    counter = iter(range(jobs))
    latencies: list[float] = []
    accepted: list[int] = []
    errors: list[str] = []

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        for i in counter:
            gpu = "resources: {accelerators: H100:1}\n" if queued else ""
            body = json.dumps({"yaml": f"name: s{i}\n{gpu}run: 'true'\n"}).encode()
            request = (f"POST /v1/jobs HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                       f"authorization: Bearer {token}\r\n"
                       f"content-length: {len(body)}\r\n\r\n").encode() + body
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            payload = await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status == 201:
                accepted.append(json.loads(payload)["job"]["id"])
            else:
                errors.append(f"{status} {payload[:200]!r}")
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, accepted, errors, time.perf_counter() - t0


def _load_process(host: str, port: int, clients: int, jobs: int, queued: bool, token: str, out) -> None:  # noqa: ANN001
    out.put(asyncio.run(_load(host, port, clients, jobs, queued, token)))


def _stored(db_url: str) -> list[int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    with engine.connect() as conn:
        ids = [row[0] for row in conn.execute(text("SELECT id FROM jobs"))]
    engine.dispose()
    return ids


def _summary(label: str, clients: int, latencies: list[float], accepted: list, errors: list, wall: float,
             stored: list | None) -> dict:
    ordered = sorted(latencies) or [0.0]
    out = {"system": label, "clients": clients, "accepted": len(accepted),
           "accepted_per_s": round(len(accepted) / wall, 1), "p50_ms": round(statistics.median(ordered) * 1000, 1),
           "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1), "errors": len(errors),
           "first_errors": errors[:3]}
    if stored is not None:
        out |= {"stored": len(stored), "stored_once": len(stored) == len(set(stored)) == len(accepted)
                and set(accepted) == set(stored)}
    return out


def run_corral(clients: int, jobs: int, db_url: str | None, queued: bool) -> dict:
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
    blockers: set[int] = set()
    try:
        url = json.loads((home / "server.json").read_text())["url"]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        token = read_local_token(home)
        auth = {"Authorization": f"Bearer {token}"}
        if queued:
            import httpx

            blocker = httpx.post(url + "/v1/jobs", json={"yaml": BLOCKER}, timeout=60, headers=auth).json()["job"]["id"]
            blockers.add(blocker)
            while httpx.get(f"{url}/v1/jobs/{blocker}", timeout=60, headers=auth).json()["state"] != "RUNNING":
                time.sleep(0.1)
        results = multiprocessing.get_context("spawn").Queue()
        loader = multiprocessing.get_context("spawn").Process(target=_load_process,
                                                               args=(host, int(port), clients, jobs, queued, token, results))
        loader.start()
        latencies, accepted, errors, wall = results.get(timeout=3600)
        loader.join()
    finally:
        subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
    stored = [i for i in _stored(db_url or f"sqlite:///{home / 'corral.db'}") if i not in blockers]
    shutil.rmtree(home, ignore_errors=True)
    return _summary(f"corral ({'postgresql' if db_url else 'sqlite'}{', queued' if queued else ''})", clients,
                    latencies, accepted, errors, wall, stored)


def _slurm_env() -> dict[str, str] | None:
    if not SLURM_ENV.exists() or shutil.which("sbatch") is None:
        return None
    env = dict(os.environ)
    for line in SLURM_ENV.read_text().splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value.strip("'\"")
    return env


def run_sbatch(clients: int, jobs: int, queued: bool) -> dict:
    env = _slurm_env()
    if env is None:
        raise SystemExit(f"--slurm: no slurm-lab ({SLURM_ENV} missing); start ../shared/tools/slurm-lab/start-slurm.sh")
    latencies: list[float] = []
    accepted: list[str] = []
    errors: list[str] = []

    def one(i: int) -> None:
        t0 = time.perf_counter()
        hold = ["--hold"] if queued else []  # held: accepted and queued, like the flood into a full pool
        done = subprocess.run(["sbatch", "--parsable", *hold, "-J", f"s{i}", "-o", "/dev/null", "--wrap", "true"],
                              env=env, capture_output=True, text=True)
        latencies.append(time.perf_counter() - t0)
        if done.returncode == 0:
            accepted.append(done.stdout.strip().split(";")[0])
        else:
            errors.append(done.stderr.strip()[:200])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(jobs)))
    wall = time.perf_counter() - t0
    subprocess.run(["scancel", "--state=PENDING"], env=env, capture_output=True)
    while subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
        time.sleep(1)  # drained before the next run
    return _summary(f"sbatch (slurm-lab{', held' if queued else ''})", clients, latencies, accepted, errors, wall,
                    None) | {"distinct_ids": len(set(accepted)) == len(accepted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--pg", help="also run against this PostgreSQL URL (its public schema is dropped)")
    parser.add_argument("--slurm", action="store_true", help="also run sbatch against slurm-lab")
    parser.add_argument("--mode", choices=["queued", "running", "both"], default="both",
                        help="queued: every GPU is taken, the flood waits (acceptance alone); running: each job "
                             "starts and ends during the flood (acceptance plus launching)")
    args = parser.parse_args()
    modes = [True, False] if args.mode == "both" else [args.mode == "queued"]
    results = []
    for db in [None] + ([args.pg] if args.pg else []):
        for queued in modes:
            results.append(run_corral(args.clients, args.jobs, db, queued))
    if args.slurm:
        for queued in modes:
            results.append(run_sbatch(args.clients, args.jobs, queued))
    def mode(r: dict) -> str:
        return "queued" if "queued" in r["system"] or "held" in r["system"] else "running"

    bases = {mode(r): r for r in results if r["system"].startswith("sbatch")}
    print("| system | clients | accepted/s | vs sbatch (same mode) | p50 | p99 | stored once |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        base = bases.get(mode(r))
        ratio = f"{r['accepted_per_s'] / base['accepted_per_s']:.2f}x" if base else "-"
        once = (f"{r['stored_once']} ({r['stored']} stored, {r['accepted']} accepted, {r['errors']} errors)"
                if "stored" in r else f"{r['accepted']} accepted, {r['errors']} errors")
        print(f"| {r['system']} | {r['clients']} | {r['accepted_per_s']} | {ratio} | {r['p50_ms']} ms | "
              f"{r['p99_ms']} ms | {once} |")
    out = Path(__file__).resolve().parent / "results" / "submit.json"
    out.write_text(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs": args.jobs, "results": results},
                              indent=1))


if __name__ == "__main__":
    main()
