"""A short run of bench/chaos.py: the server killed with SIGKILL at random moments (also
during start-up and recovery) under a mixed workload; nothing acknowledged is lost, no
attempt is recorded that did not run, no replica is alive twice, every job ends as it must."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos import run  # noqa: E402


def test_kill_9_at_random_moments_breaks_no_promise(tmp_path: Path) -> None:
    report = run(jobs=30, kills=4, seed=7, home=tmp_path / "home", quiet=True)
    assert report["jobs"] >= 25 and report["kills"] >= 4
    assert report["violations"] == [], report["violations"]


def test_cut_database_connections_break_no_promise(tmp_path: Path) -> None:
    """Every connection the server holds to PostgreSQL (its claim's too) is cut every 0.3 s
    while jobs are submitted, exit and are cancelled: no exit is lost, no job stays running
    without a process, no cancel is forgotten, the server keeps its claim."""
    import pytest

    from conftest import PG_URL, reset_postgres

    db = PG_URL  # this worker's database under pytest-xdist
    if not db:
        pytest.skip("needs PostgreSQL (CORRAL_TEST_DB_URL)")

    reset_postgres(db)
    report = run(jobs=40, kills=0, seed=11, home=tmp_path / "home", quiet=True, db=db, cut_every=0.3)
    assert report["jobs"] >= 30 and report["connections_cut"] >= 5, report
    assert report["violations"] == [], report["violations"]
