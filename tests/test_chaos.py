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
