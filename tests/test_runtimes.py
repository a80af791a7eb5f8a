"""Run times learned from history by a real server over a real store (SQLite, and PostgreSQL
when CORRAL_TEST_DB_URL is set): the column's migration up and down, predictions seeded from
the store's finished jobs and kept across a restart, the prediction a job starts with stored,
a new end learned, and backfill's start estimates planned with predictions when the site
says so (and with time limits when it does not)."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, update

from conftest import POOL, bearer, kill_leftovers, submit, wait_for, wait_state
from corral.spec import load_job
from corral.store import repository
from corral.store.database import MIGRATIONS, make_engine, migrate
from corral.store.tables import Job

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

LEARNING = POOL + "scheduler: {learn_durations: true}\n"


def _alembic(conn) -> Config:  # noqa: ANN001 - a Connection
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def _columns(engine) -> set[str]:  # noqa: ANN001
    return {c["name"] for c in inspect(engine).get_columns("jobs")}


def test_the_predicted_run_time_column_migrates_up_and_down(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    assert "predicted_run_s" in _columns(engine)
    with engine.begin() as conn:
        command.downgrade(_alembic(conn), "0009")
    assert "predicted_run_s" not in _columns(engine) and "run_as" in _columns(engine)
    migrate(engine)
    assert "predicted_run_s" in _columns(engine)
    engine.dispose()


@contextmanager
def running_server(home: Path, db_url: str, history: list[tuple[str, str, int, float]] = ()):
    """A server over ``home``'s store, with ``history`` (user, name, GPUs, run seconds) stored
    as finished jobs before its loop starts."""
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    state = build_state(Settings(home=home, db_url=db_url, poll_interval_s=0.2))
    if history:
        with state.sessions() as s:
            for i, (user, name, gpus, run_s) in enumerate(history):
                spec = load_job(f"name: {name}\nresources: {{accelerators: H100:{gpus}}}\nrun: echo\n").spec
                job = repository.create_job(s, spec, user, 1000.0 + i)
                s.execute(update(Job).where(Job.id == job.id).values(
                    state="SUCCEEDED", started_at=2000.0 + i, ended_at=2000.0 + i + run_s))
            s.commit()
    with TestClient(create_app(state), headers=bearer(state, "alice")) as client:
        yield client


def _predicted(client, job_id: int):  # noqa: ANN001
    return client.get(f"/v1/jobs/{job_id}").json()["predicted_run_s"]


HOG = "name: hog\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 120\n"
TRAIN = "name: train\nresources: {accelerators: H100:4}\nrun: sleep 1\n"


def test_history_seeds_predictions_that_survive_a_restart_and_new_ends_are_learned(
        corral_home: Path, db_url: str) -> None:
    history = [("alice", "train", 4, 100.0), ("alice", "train", 4, 400.0), ("alice", "train", 4, 1600.0),
               ("bob", "train", 4, 5.0)]
    try:
        with running_server(corral_home, db_url, history) as server:
            hog = submit(server, HOG)
            wait_state(server, hog["id"], "RUNNING")
            train = submit(server, TRAIN, scheduling={"time_limit": 3600})
            # the geometric mean of alice's three runs of train on 4 GPUs (bob's are his)
            assert math.isclose(wait_for(lambda: _predicted(server, train["id"])), 400.0, rel_tol=1e-3)
            assert server.get(f"/v1/jobs/{train['id']}").json()["state"] == "PENDING"
            # the hog had no history of its own name: it started with alice's any-job prediction
            assert _predicted(server, hog["id"]) is not None
        with running_server(corral_home, db_url) as server:  # a restart: the store's history again
            assert math.isclose(wait_for(lambda: _predicted(server, train["id"])), 400.0, rel_tol=1e-3)
            server.post(f"/v1/jobs/{hog['id']}/cancel")
            ended = wait_state(server, train["id"], "SUCCEEDED", timeout=30)
            assert math.isclose(ended["predicted_run_s"], 400.0, rel_tol=1e-3)  # what it started with, stored
            real = (datetime.fromisoformat(ended["ended_at"]) - datetime.fromisoformat(ended["started_at"])).seconds
            assert real < 60
            # its short run is learned: the next train is predicted shorter (window 100, 400, 1600, ~1 s)
            hog2 = submit(server, HOG)
            wait_state(server, hog2["id"], "RUNNING")
            again = submit(server, TRAIN, scheduling={"time_limit": 3600})
            guess = wait_for(lambda: _predicted(server, again["id"]))
            assert 60.0 <= guess < 150.0
            for job in (hog2, again):
                server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, again["id"], "CANCELLED")
    finally:
        kill_leftovers(corral_home)


@pytest.mark.parametrize("site_config", [POOL, LEARNING], ids=["limits", "learned"])
def test_start_estimates_plan_with_predictions_when_the_site_learns_them(
        corral_home: Path, db_url: str, site_config: str) -> None:
    learning = "learn_durations" in site_config
    try:
        with running_server(corral_home, db_url, [("alice", "hog", 8, 90.0)]) as server:
            hog = submit(server, HOG, scheduling={"time_limit": 3600})
            running = wait_state(server, hog["id"], "RUNNING")
            assert math.isclose(running["predicted_run_s"], 90.0)
            started = datetime.fromisoformat(running["started_at"]).timestamp()
            waiter = submit(server, TRAIN, scheduling={"time_limit": 600})

            def estimate():  # noqa: ANN202
                return server.get(f"/v1/jobs/{waiter['id']}").json()["expected_start"]

            expected = datetime.fromisoformat(wait_for(estimate)).timestamp()
            # planned after the hog's predicted end (started + 90 s), else after its limit
            planned = started + (90.0 if learning else 3600.0)
            assert abs(expected - planned) < 5, (expected - started, learning)
            assert time.time() < expected
            for job in (hog, waiter):
                server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, waiter["id"], "CANCELLED")
    finally:
        kill_leftovers(corral_home)


def test_queue_start_and_acct_show_predictions_and_how_good_they_were(corral_home: Path, tmp_path: Path) -> None:
    import csv
    import io
    import json

    from conftest import cli_for

    corral = cli_for(corral_home)
    spec = tmp_path / "train.yaml"
    spec.write_text("resources: {accelerators: H100:4}\nrun: sleep 1\n")
    hog_spec = tmp_path / "hog.yaml"
    hog_spec.write_text(HOG)

    def status(job: str) -> dict:
        return json.loads(corral("status", job, "--json", check=True).stdout)

    try:
        first = corral("launch", "-d", "--name", "train", str(spec), check=True).stdout.strip()
        wait_for(lambda: status(first)["state"] == "SUCCEEDED")
        second = corral("launch", "-d", "--name", "train", str(spec), check=True).stdout.strip()
        wait_for(lambda: status(second)["state"] == "SUCCEEDED")
        assert status(first)["predicted_run_s"] is None  # nothing to learn from yet
        assert status(second)["predicted_run_s"] == 60.0  # a one-second run: the one-minute floor
        hog = corral("launch", "-d", str(hog_spec), check=True).stdout.strip()
        wait_for(lambda: status(hog)["state"] == "RUNNING")
        waiting = corral("launch", "-d", "--name", "train", "-t", "1h", str(spec), check=True).stdout.strip()
        wait_for(lambda: status(waiting)["predicted_run_s"])
        rows = [r.split("\t") for r in corral("queue", "--start", check=True).stdout.splitlines()]
        header = rows[0]
        assert header[5:7] == ["START_TIME", "RUN_TIME"]
        (row,) = rows[1:]
        assert row[0] == waiting and row[6] == "00:01:00"

        done = corral("acct", "-s", "CD", "--format", "csv", check=True)
        table = {r["id"]: r for r in csv.DictReader(io.StringIO(done.stdout))}  # stdout: rows only
        assert set(table) == {first, second}
        assert table[first]["predicted_run_s"] == "" and float(table[second]["predicted_run_s"]) == 60.0
        assert "predicted run times: 1 job(s) judged, 0% within 2x" in done.stderr
        piped = corral("acct", "-s", "CD", check=True)
        lines = piped.stdout.splitlines()
        assert "PREDICTED" in lines[0].split("\t") and len(lines) == 3  # header and two rows, no summary
        assert lines[2].split("\t")[lines[0].split("\t").index("PREDICTED")] == "00:01:00"
        assert "predicted run times" in piped.stderr
        assert json.loads(corral("acct", "-s", "CD", "--json", check=True).stdout)[1]["predicted_run_s"] == 60.0
        corral("cancel", "--state", "RUNNING", "--state", "PENDING", check=True)
    finally:
        corral.stop()


def test_an_end_whose_write_is_lost_is_learned_once_when_the_retried_cycle_commits_it(server) -> None:
    """The write that ends the job fails (a connection cut mid-commit): the cycle's memory
    is rebuilt, the exit applied again, and the run learned once, from the commit that held."""
    loop = server.state.loop
    journal = loop.journal
    real, cut = journal.flush, []

    def flaky(session) -> None:  # noqa: ANN001
        if not cut and any(v.get("state") == "SUCCEEDED" for v in journal._rows[Job].values()):
            cut.append(True)
            raise ConnectionError("the database connection was cut mid-commit")
        real(session)

    journal.flush = flaky
    try:
        job = submit(server, "name: once\nrun: sleep 0.3\n")
        wait_state(server, job["id"], "SUCCEEDED")
    finally:
        journal.flush = real
    assert cut
    # The state is visible from the retried cycle's first commit; the loop counts the cycle
    # as good only when the whole of it has run.
    wait_for(lambda: loop.failing_cycles == 0, timeout=10)
    assert len(loop.runtimes.model._history[("un", "alice", "once", 0)]) == 1
    assert loop.runtimes.model.predict("alice", "once", 0, None) == 60.0  # a sub-minute run: the floor


SPREAD = POOL + "scheduler: {learn_durations: true, learn_spread: 2}\n"


@pytest.mark.parametrize("site_config", [LEARNING, SPREAD], ids=["any", "spread-2"])
def test_a_history_that_disagrees_is_trusted_only_without_a_spread_bound(
        corral_home: Path, db_url: str, site_config: str) -> None:
    """``learn_spread: 2``: runs of 90 s and 900 s are too far apart to predict from, so the
    job is planned with its limit (no prediction); without the bound it is predicted."""
    try:
        with running_server(corral_home, db_url, [("alice", "hog", 8, 90.0), ("alice", "hog", 8, 900.0)]) as server:
            hog = submit(server, HOG, scheduling={"time_limit": 3600})
            running = wait_state(server, hog["id"], "RUNNING")
            if "learn_spread" in site_config:
                assert running["predicted_run_s"] is None, running
            else:
                assert running["predicted_run_s"] is not None and 90.0 <= running["predicted_run_s"] <= 900.0, running
            server.post(f"/v1/jobs/{hog['id']}/cancel")
            wait_state(server, hog["id"], "CANCELLED")
    finally:
        kill_leftovers(corral_home)
