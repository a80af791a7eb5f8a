"""One server per database: two CORRAL_HOMEs pointed at one CORRAL_DB_URL must not both run
control loops over the same jobs (each would start them), so the second server refuses to
start, saying why, until the first is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from conftest import POOL

from corral.store.database import SERVER_LOCK_KEY, redacted

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


def cli(home: Path, db_url: str, *args: str, module: str = "corral.cli.main") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), CORRAL_DB_URL=db_url)
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_second_server_on_the_same_database_refuses_to_start(db_url: str, tmp_path: Path) -> None:
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
        (home / "config.yaml").write_text(POOL)
    try:
        first = cli(homes[0], db_url, "server", "start")
        assert first.returncode == 0, first.stderr
        second = cli(homes[1], db_url, "server", "start")
        assert second.returncode != 0
        assert "another corral server already runs jobs from the database" in second.stderr
        assert not (homes[1] / "server.json").exists()
        assert cli(homes[1], db_url, "queue").returncode != 0  # nor does a command start one behind its back
        same_home = cli(homes[0], db_url, module="corral.server")
        assert same_home.returncode == 3 and "already serves" in same_home.stderr
        assert cli(homes[0], db_url, "server", "stop").returncode == 0
        again = cli(homes[1], db_url, "server", "start")  # the claim went with the first server
        assert again.returncode == 0, again.stderr
    finally:
        for home in homes:
            cli(home, db_url, "server", "stop")


def test_the_refusal_does_not_print_a_database_password() -> None:
    shown = redacted("postgresql+psycopg://corral:s3cret@db.example:5432/corral")
    assert "s3cret" not in shown and "db.example:5432/corral" in shown


def _postgres(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("a claim on SQLite is a file lock, which cannot be lost while the server lives")


def _server_pid(home: Path) -> int:
    return json.loads((home / "server.json").read_text())["pid"]


def _cut_connections(db_url: str) -> int:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        cut = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
    engine.dispose()
    return int(cut or 0)


def _start_job(home: Path, db_url: str, tmp_path: Path, name: str) -> tuple[str, Path]:
    marker = tmp_path / f"{name}.pid"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\nrun: echo $$ > {marker}; exec sleep 300\n")
    launched = cli(home, db_url, "launch", "-d", str(spec))
    assert launched.returncode == 0, launched.stderr
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the job never started"
    return launched.stdout.strip(), marker


def test_a_server_whose_claim_is_taken_over_stops_and_leaves_nothing_running(db_url: str, tmp_path: Path) -> None:
    """Its connections are cut and, before it can take its claim again, another server takes
    it: this one must stop at once (never run beside the other) and kill what it started."""
    _postgres(db_url)
    home = tmp_path / "a"
    home.mkdir()
    (home / "config.yaml").write_text(POOL)
    try:
        assert cli(home, db_url, "server", "start").returncode == 0
        pid = _server_pid(home)
        _, marker = _start_job(home, db_url, tmp_path, "holder")
        replica = int(marker.read_text())
        assert psutil.pid_exists(replica)
        # what a second server does on start: the advisory lock, then the epoch raised; its
        # connections are cut until the lock is ours (it would take it again otherwise)
        engine = create_engine(db_url, poolclass=NullPool)
        other = engine.connect()
        deadline = time.monotonic() + 20
        while True:
            other.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
            if other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": SERVER_LOCK_KEY}).scalar():
                break
            assert time.monotonic() < deadline, "the cut server's lock never went away"
            time.sleep(0.02)
        other.execute(text("UPDATE server_claim SET epoch = epoch + 1, holder = 'test' WHERE id = 1"))
        other.commit()
        try:
            deadline = time.monotonic() + 20
            while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the server runs on without its claim"
                time.sleep(0.1)
            deadline = time.monotonic() + 10
            while psutil.pid_exists(replica) and psutil.Process(replica).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "its replica outlived the claim: it would be alive twice"
                time.sleep(0.1)
            log = (home / "server.log").read_text()
            assert "lost its claim" in log
        finally:
            other.close()
            engine.dispose()
    finally:
        cli(home, db_url, "server", "stop")


def test_a_server_whose_connections_are_cut_takes_its_claim_again_and_keeps_running(db_url: str,
                                                                                    tmp_path: Path) -> None:
    """Nobody else took the claim: the server takes it again, its job runs on, and a second
    server is still refused."""
    _postgres(db_url)
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
        (home / "config.yaml").write_text(POOL)
    try:
        assert cli(homes[0], db_url, "server", "start").returncode == 0
        pid = _server_pid(homes[0])
        job_id, marker = _start_job(homes[0], db_url, tmp_path, "steady")
        assert _cut_connections(db_url) >= 1
        time.sleep(2.5)  # a claim check or two later
        assert psutil.pid_exists(pid), (homes[0] / "server.log").read_text()[-2000:]
        second = cli(homes[1], db_url, "server", "start")
        assert second.returncode != 0 and "another corral server already runs jobs" in second.stderr
        assert psutil.pid_exists(int(marker.read_text()))
        status = cli(homes[0], db_url, "status", job_id, "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "RUNNING"
        assert cli(homes[0], db_url, "cancel", job_id).returncode == 0
    finally:
        for home in homes:
            cli(home, db_url, "server", "stop")
