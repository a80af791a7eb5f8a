"""Crash the corral server at random moments and check the first law: nothing lost, nothing
run twice, nothing alive twice.

  python bench/chaos.py [--jobs 120] [--kills 8] [--seed 0]

Submits a mixed workload over HTTP (plain jobs, failing jobs, flaky jobs that restart
``on_failure`` until they succeed, job groups with termination delays, long jobs cancelled at
random moments) while killing the server with SIGKILL at random moments — also during its
start-up and recovery, and twice in a row — and starting it again. Every attempt of every
replica writes a marker line with its attempt key when it starts, and holds a per-replica
``flock`` for its whole life (so an attempt starting while an earlier one of the same replica
still runs records DOUBLE). Then it checks:

* every acknowledged submission is stored exactly once;
* no attempt is recorded that did not run (restarts recorded <= attempts that started - 1,
  and exit codes are the ones the programs exited with);
* no replica was ever alive twice (no DOUBLE) and no process of the run outlives it;
* every job ends in the state its kind must end in.

With ``--db postgresql+psycopg://…`` the server runs on PostgreSQL, and ``--cut-every S``
also cuts every connection the server holds to it (``pg_terminate_backend``, its claim's
too) every S seconds while the workload is submitted: the same promises must hold, and the
server must keep its claim (taken again) and finish every job.

Prints the counts; exits 1 on any violation. ``run()`` is what the CI tests call (smaller)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from corral.credentials import read_local_token

POOL = "nodes:\n  - {name: n, count: 2, gpus: 4, cpus: 8, memory: 16}\n"

KINDS = {
    # kind: (yaml template, final state)
    "plain": ("name: {name}\nresources: {{accelerators: 1}}\nrun: {guard}; sleep {secs}\n", "SUCCEEDED"),
    "failing": ("name: {name}\nrun: {guard}; sleep {secs}; exit 3\n", "FAILED"),
    "flaky": ("name: {name}\nrestart: {{policy: on_failure, max_restarts: 10, backoff: {{initial: 0.2s}}}}\n"
              "run: {guard}; sleep {secs}; n=$(grep -c . {markers}/{name}); [ $n -ge 3 ]\n", "SUCCEEDED"),
    "group": ("name: {name}\nexecution: parallel\nprimary_tasks: [main]\ntermination_delay: 0.5s\n---\n"
              "name: main\nrun: {guard}; sleep {secs}\n---\nname: side\nrun: {guard}; trap 'exit 0' TERM; "
              "while true; do sleep 0.1; done\n", "SUCCEEDED"),
    "cancelled": ("name: {name}\nrun: {guard}; sleep 600\n", "CANCELLED"),
}

# First lines of every attempt: record its key, then take the replica's lock for its whole
# life (fd 9 is inherited by everything it starts).
GUARD = ("echo $CORRAL_LAUNCH_KEY >> {markers}/{name}; exec 9>{locks}/$CORRAL_JOB_NAME.$CORRAL_TASK.$CORRAL_REPLICA; "
         "flock -n 9 || echo DOUBLE $CORRAL_LAUNCH_KEY >> {markers}/DOUBLE")


class Server:
    def __init__(self, home: Path, db: str | None = None):
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        self.env["CORRAL_HOME"] = str(home)
        if db:
            self.env["CORRAL_DB_URL"] = db
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    def start(self) -> None:
        (self.home / "server.json").unlink(missing_ok=True)
        log = open(self.home / "chaos-server.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.server"], env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_up(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = json.loads((self.home / "server.json").read_text())
                if info["pid"] == self.proc.pid:
                    self.url = info["url"]
                    if httpx.get(self.url + "/v1/health", timeout=2).status_code == 200:
                        return True
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                pass
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    @property
    def auth(self) -> dict[str, str]:
        """The current server's local token (each start writes a new one)."""
        return {"Authorization": f"Bearer {read_local_token(self.home)}"}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Cutter:
    """Terminates every other connection to the server's PostgreSQL database, every ``every``
    seconds, on its own thread, until stopped."""

    def __init__(self, db: str, every: float):
        from sqlalchemy import create_engine, text

        self.every, self.cuts, self._text = every, 0, text
        self._engine = create_engine(db, pool_size=1, max_overflow=0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                with self._engine.begin() as conn:
                    cut = conn.execute(self._text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
                self.cuts += int(cut or 0)
            except Exception:  # the cutter's own connection is pooled: try again next time
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._engine.dispose()


def run(jobs: int = 120, kills: int = 8, seed: int = 0, home: Path | None = None, quiet: bool = False,
        db: str | None = None, cut_every: float | None = None) -> dict:
    rng = random.Random(seed)
    home = home or Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(POOL)
    markers, locks = home / "markers", home / "locks"
    markers.mkdir(exist_ok=True)
    locks.mkdir(exist_ok=True)
    server = Server(home, db)
    server.start()
    assert server.wait_up(), (home / "chaos-server.log").read_text()[-3000:]
    cutter = Cutter(db, cut_every) if db and cut_every else None
    if cutter is not None:
        cutter.start()
    plan = [rng.choice(list(KINDS)) for _ in range(jobs)]
    acknowledged: dict[int, tuple[str, str]] = {}  # id -> (name, kind)
    to_cancel: list[int] = []
    kill_at = sorted(rng.sample(range(1, jobs), min(kills, jobs - 1)))
    kills_done, refused = 0, 0

    def submit(i: int, kind: str) -> None:
        nonlocal refused
        name = f"c{seed}x{i}{kind[:2]}"
        guard = GUARD.format(markers=markers, locks=locks, name=name)
        text = KINDS[kind][0].format(name=name, guard=guard, secs=round(rng.uniform(0.05, 1.5), 2),
                                     markers=markers)
        for attempt in range(3):
            try:
                if attempt:  # the first try may have been stored before its answer was lost
                    found = httpx.get(server.url + "/v1/jobs", params={"all": "true", "name": name}, timeout=10, headers=server.auth).json()
                    if found:
                        return  # stored, never acknowledged: not counted as acknowledged
                response = httpx.post(server.url + "/v1/jobs", json={"yaml": text}, timeout=10, headers=server.auth)
            except httpx.HTTPError:
                refused += 1
                if not server.wait_up(10):
                    server.start()
                    server.wait_up()
                continue
            if response.status_code >= 500:  # refused while its database was cut: tried again
                refused += 1
                time.sleep(0.1)
                continue
            if response.status_code == 201:
                job_id = response.json()["job"]["id"]
                acknowledged[job_id] = (name, kind)
                if kind == "cancelled":
                    to_cancel.append(job_id)
            return

    for i, kind in enumerate(plan):
        submit(i, kind)
        if to_cancel and rng.random() < 0.3:
            job_id = to_cancel.pop(rng.randrange(len(to_cancel)))
            try:
                if httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", timeout=10,
                              headers=server.auth).status_code >= 500:
                    to_cancel.append(job_id)  # refused while its database was cut: asked again later
            except httpx.HTTPError:
                to_cancel.append(job_id)
        if kill_at and i == kill_at[0]:
            kill_at.pop(0)
            time.sleep(rng.uniform(0.0, 1.0))
            server.kill()
            kills_done += 1
            server.start()
            if rng.random() < 0.4:  # again, during start-up or recovery
                time.sleep(rng.uniform(0.05, 0.8))
                server.kill()
                kills_done += 1
                server.start()
            assert server.wait_up(), (home / "chaos-server.log").read_text()[-3000:]
    if cutter is not None:
        cutter.stop()
    for job_id in to_cancel:
        for _ in range(20):
            try:
                if httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", timeout=10,
                              headers=server.auth).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    deadline = time.monotonic() + 180
    stored: dict[int, dict] = {}
    while time.monotonic() < deadline:
        listed = httpx.get(server.url + "/v1/jobs", params={"all": "true", "limit": 10000}, timeout=30, headers=server.auth).json()
        stored = {j["id"]: j for j in listed}
        if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT") for j in listed):
            break
        time.sleep(0.5)
    report = check(server, home, acknowledged, stored, markers)
    report.update(jobs=len(acknowledged), kills=kills_done, refused_while_down=refused,
                  connections_cut=cutter.cuts if cutter is not None else 0)
    if server.proc is not None and server.proc.poll() is not None and not kills:
        report["violations"].append(f"the server exited (code {server.proc.returncode}) with nobody else on its database")
    server.kill()
    leftovers = _processes_of(home)
    report["violations"] += [f"process {p} of the run still alive" for p in leftovers]
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not quiet:
        print(json.dumps({k: v for k, v in report.items() if k != "violations"}))
        for line in report["violations"][:50]:
            print("VIOLATION:", line)
    return report


def check(server: Server, home: Path, acknowledged: dict, stored: dict, markers: Path) -> dict:
    violations: list[str] = []
    names = [j["name"] for j in stored.values()]
    for job_id, (name, kind) in acknowledged.items():
        job = stored.get(job_id)
        if job is None:
            violations.append(f"job {job_id} ({name}) acknowledged but not stored")
            continue
        if names.count(name) != 1:
            violations.append(f"{name} stored {names.count(name)} times")
        want = KINDS[kind][1]
        if kind == "cancelled" and job["state"] != "CANCELLED":
            violations.append(f"{name}: {job['state']}, cancelled expected")
        elif kind != "cancelled" and job["state"] != want:
            violations.append(f"{name} ({kind}): {job['state']} ({job.get('message')}), {want} expected")
        started = (markers / name).read_text().split() if (markers / name).exists() else []
        for task in job["tasks"]:
            for r in task["replicas"]:
                mine = [k for k in started if k.split(".")[1:3] == [task["name"], str(r["rank"])]]
                if r["restarts"] > max(0, len(set(mine)) - 1):
                    violations.append(f"{name} {task['name']}-{r['rank']}: {r['restarts']} restarts recorded, "
                                      f"{len(set(mine))} attempts started")
                if len(mine) != len(set(mine)):
                    violations.append(f"{name}: an attempt key started twice: {mine}")
        if kind == "failing" and job["state"] == "FAILED" and job["exit_code"] not in (3, None):
            violations.append(f"{name}: exit code {job['exit_code']} recorded, the program exits 3")
    double = markers / "DOUBLE"
    if double.exists():
        violations += [f"alive twice: {line}" for line in double.read_text().splitlines()]
    extra = set(stored) - set(acknowledged)
    states = {}
    for job in stored.values():
        states[job["state"]] = states.get(job["state"], 0) + 1
    return {"violations": violations, "states": states, "unacknowledged_but_stored": len(extra)}


def _processes_of(home: Path) -> list[int]:
    out = []
    for proc in psutil.process_iter():
        try:
            if str(home) in proc.environ().get("CORRAL_CHECKPOINT_DIR", "") and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", help="run the server on this PostgreSQL URL (default: SQLite in its home)")
    parser.add_argument("--cut-every", type=float, help="with --db: cut the server's connections every S seconds")
    args = parser.parse_args()
    report = run(args.jobs, args.kills, args.seed, db=args.db, cut_every=args.cut_every)
    sys.exit(1 if report["violations"] else 0)


if __name__ == "__main__":
    main()
