"""The cgroup helper thread's warm-ups (``corral.node.proctree._Ahead``): a warm-up is a
no-op move of the server into its own cgroup, kept up every ``period_s`` for ``keep_s`` so
the kernel's cgroup lock stays in its fast mode through a burst of starts, then left alone.
The "own cgroup.procs" here is a plain file: each move is one write of the server's pid."""

from __future__ import annotations

import os
import time
from pathlib import Path

from corral.node.proctree import _Ahead


def _moves(procs: Path) -> int:
    return len(procs.read_bytes()) // len(str(os.getpid()))


def _settled(procs: Path, quiet: float = 0.15, timeout: float = 5.0) -> int:
    """The count of moves once none came for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = _moves(procs)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = _moves(procs)
        if now == last:
            return now
        last = now
    raise AssertionError("moves never stopped")


def test_a_warm_up_is_kept_up_for_its_window_then_stops(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_bytes(b"")
    ahead = _Ahead(tmp_path, procs, keep_s=0.3, period_s=0.01)
    started = time.monotonic()
    ahead.ask(warm=True)
    moves = _settled(procs)
    took = time.monotonic() - started
    assert procs.read_bytes() == str(os.getpid()).encode() * moves  # each a move of the server itself
    assert moves >= 8, moves  # kept up through the window, not one move
    assert took < 0.3 + 2.0  # and then it stopped
    again = time.monotonic()
    ahead.ask(warm=True)  # a later warm-up opens a new window
    assert _settled(procs) >= moves + 8
    assert time.monotonic() - again >= 0.3


def test_making_and_sweeping_cgroups_keeps_nothing_warm(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_bytes(b"")
    ahead = _Ahead(tmp_path, procs, keep_s=5.0, period_s=0.01)
    ahead.ask(make="7.t.0.a1")
    deadline = time.monotonic() + 5
    while not (tmp_path / "7.t.0.a1").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "7.t.0.a1").is_dir()
    ahead.ask(sweep=7)
    while (tmp_path / "7.t.0.a1").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not (tmp_path / "7.t.0.a1").exists()
    time.sleep(0.1)
    assert _moves(procs) == 0  # only a warm-up moves the server


def test_an_own_cgroup_it_may_not_write_is_given_up_at_once(tmp_path: Path) -> None:
    ahead = _Ahead(tmp_path, tmp_path / "missing" / "cgroup.procs", keep_s=5.0, period_s=0.01)
    ahead.ask(warm=True)
    deadline = time.monotonic() + 5
    while ahead.own_procs is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ahead.own_procs is None  # never tried again, and no window kept for it
    ahead.ask(make="8.t.0.a1")  # the thread still does the rest of its work
    while not (tmp_path / "8.t.0.a1").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "8.t.0.a1").is_dir()
