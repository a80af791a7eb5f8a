"""Shared fixtures: a temporary CORRAL_HOME with a declared virtual node pool, database
URLs (SQLite always; PostgreSQL too when CORRAL_TEST_DB_URL is set), and an in-process
server (store + control loop + API) for API tests."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).parent))

POOL = """
nodes:
  - name: gpu
    count: 2
    gpus: 4
    gpu_type: H100
    cpus: 8
    memory: 64
    labels: {switch: leaf0}
"""

PG_URL = os.environ.get("CORRAL_TEST_DB_URL")
DB_PARAMS = ["sqlite"] + (["postgresql"] if PG_URL else [])


def reset_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=DB_PARAMS)
def db_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'corral.db'}"
    reset_postgres(PG_URL)
    return PG_URL


@pytest.fixture
def site_config() -> str:
    """The config.yaml of the test's CORRAL_HOME; a test module overrides it to declare
    partitions, accounts, QOS …"""
    return POOL


@pytest.fixture
def corral_home(tmp_path: Path, site_config: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(site_config)
    return home


@pytest.fixture
def server(corral_home: Path, db_url: str) -> Iterator:
    """An in-process server with a real control loop and local executor."""
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    state = build_state(settings)
    app = create_app(state)
    with TestClient(app, headers=bearer(state, "alice")) as client:
        client.state = state
        yield client
    kill_leftovers(corral_home)


def bearer(state, user: str, role: str | None = None) -> dict[str, str]:
    """Headers acting as ``user`` on an in-process server: a new token of theirs (``role``: none
    means the one config.yaml gives them)."""
    _, token = state.tokens.create(user, role, None, None, "test")
    return {"Authorization": f"Bearer {token}"}


def kill_leftovers(home: Path) -> None:
    """Kill replica processes a failed test may have left behind (by their launch key)."""
    import psutil

    for proc in psutil.process_iter():
        try:
            if str(home) in proc.environ().get("CORRAL_CHECKPOINT_DIR", ""):
                proc.kill()
        except (psutil.Error, OSError):
            continue


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
