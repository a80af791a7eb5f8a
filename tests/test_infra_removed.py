"""An infra taken out of config.yaml while a replica runs on it, then the server restarted.
With the infra's configuration gone nothing can reach that replica to end it or to see that it
ended (a Ray cluster's address, a Slurm cluster's commands), so a restart or a requeue that
ran it again could run beside it. The job is requeued held (an operator's hold): it waits,
saying why, until an operator who can look releases it; then it runs again, once."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psutil

from conftest import cli_events, cli_for, shared_account, wait_for

NODES = "nodes:\n  - {name: n1, gpus: 2, gpu_type: H100, cpus: 8, memory: 64}\n"


def _status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def test_a_replica_on_an_infra_removed_from_the_configuration_holds_its_job_for_an_operator(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(NODES + shared_account(NODES))
    corral = cli_for(home, timeout=120)
    marks = tmp_path / "attempts"
    try:
        spec = tmp_path / "one.yaml"
        spec.write_text(f"name: one\nresources: {{accelerators: H100:1}}\n"
                        f"restart: {{policy: always, max_restarts: 3}}\n"
                        f"run: echo $CORRAL_LAUNCH_KEY >> {marks}; exec sleep 600\n")
        job = corral("launch", "-d", str(spec), check=True).stdout.strip()
        running = wait_for(lambda: (s := _status(corral, job))["state"] == "RUNNING"
                           and s["tasks"][0]["replicas"][0]["pid"] and s, timeout=60)
        first = psutil.Process(running["tasks"][0]["replicas"][0]["pid"])
        wait_for(lambda: marks.exists() and marks.read_text().strip(), timeout=30)

        corral("server", "stop", check=True)  # its replica runs on, as replicas do across restarts
        assert first.is_running()
        # as if it had run on an infra (say a Ray cluster) whose section config.yaml no longer has
        with sqlite3.connect(home / "corral.db") as db:
            assert db.execute("UPDATE replicas SET infra = 'phantom' WHERE job_id = ?", (int(job),)).rowcount == 1
        corral("queue", check=True)  # the server starts again

        held = wait_for(lambda: (s := _status(corral, job))["state"] == "PENDING" and s, timeout=60)
        assert held["reason"] == "JobHeldAdmin", held
        events = cli_events(corral, job)
        assert any("may still run where corral cannot see or stop it" in (e.get("message") or "")
                   and "infra 'phantom' is not configured any more" in (e.get("message") or "") for e in events), events
        # neither restarted (its policy would have) nor started again while held
        corral("queue", check=True)
        assert _status(corral, job)["state"] == "PENDING"
        assert len(marks.read_text().split()) == 1
        assert first.is_running()  # corral could not reach it: it is the operator's to end

        first.kill()
        first.wait(10)
        assert corral("release", job).returncode == 0  # the embedded server's user is its operator
        wait_for(lambda: _status(corral, job)["state"] == "RUNNING", timeout=60)
        wait_for(lambda: len(marks.read_text().split()) == 2, timeout=30)
        assert corral("cancel", job, timeout=60).returncode == 0
        wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60)
    finally:
        corral.stop()
