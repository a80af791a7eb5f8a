"""The fence of a Ray attempt (``corral.executors.ray.fence``) with real processes and no Ray:
it ends the attempt's whole tree when its worker or the node's raylet dies, and it survives
what a Ray worker does to its direct children when it exits (SIGKILL, see
``RAY_kill_child_processes_on_worker_exit``), which would otherwise take the fence with it
and leave the attempt running beside its next attempt."""

from __future__ import annotations

import itertools
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_for
from corral.executors.ray.fence import FENCED_FILE
from corral.node.proctree import ATTEMPT_VAR, attempt_mark


_KEYS = itertools.count(7)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _high(fd: int, at: int) -> int:
    """``fd`` moved to ``at`` (a worker with many descriptors open passes its pipe that high)."""
    os.dup2(fd, at)
    os.close(fd)
    return at


def _readable(fd: int, timeout: float) -> bool:
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    return bool(waiting.poll(timeout * 1000))


@pytest.fixture
def world(tmp_path: Path, monkeypatch, request):
    """A fake raylet, an attempt (a loop that forks all the time, in a session of its own,
    carrying its mark), and the fence started as the actor starts it; with ``"high"`` as the
    fixture's parameter, the pipes sit above descriptor 1024."""
    monkeypatch.setenv("CORRAL_RAY_DIR", str(tmp_path))
    # a key of its own per test: a fence still finishing the previous test's kill (it finds the
    # attempt's processes by key) must not take this test's attempt for its own
    scope, key = f"fence{os.getpid()}", f"{next(_KEYS)}.work.0.1"
    from corral.executors.ray.actor import node_runner
    runner = node_runner(scope)
    runner.run_dir(key).mkdir(parents=True)
    raylet = subprocess.Popen(["sleep", "600"])
    attempt = subprocess.Popen(["bash", "-c", "while true; do sleep 0.05; done"], start_new_session=True,
                               env={**os.environ, ATTEMPT_VAR: attempt_mark(scope, key)})
    read, write = os.pipe()
    gone_read, gone_write = os.pipe()
    if getattr(request, "param", "low") == "high":
        if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
            pytest.skip("descriptors above 1024 need a soft RLIMIT_NOFILE over 1200")
        read, write, gone_read, gone_write = (_high(fd, 1100 + i) for i, fd in
                                              enumerate((read, write, gone_read, gone_write)))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG", "CORRAL_RAY_DIR")}
    fence = subprocess.Popen([sys.executable, "-m", "corral.executors.ray.fence", str(read), str(raylet.pid), scope,
                              key], pass_fds=(read, gone_write), start_new_session=True, env=env)
    os.close(read)
    os.close(gone_write)
    time.sleep(1.5)  # the fence imports and starts watching
    yield {"runner": runner, "key": key, "raylet": raylet, "attempt": attempt, "fence": fence, "write": write,
           "gone": gone_read}
    for proc in (raylet, attempt):
        proc.kill()
        proc.wait()
    _readable(gone_read, 10.0)  # the fence is gone before the next test starts
    for fd in (write, gone_read):
        try:
            os.close(fd)
        except OSError:
            pass


def test_the_fence_outlives_a_sigkill_of_the_worker_s_children_and_ends_the_attempt_when_the_raylet_dies(world):
    fence, attempt = world["fence"], world["attempt"]
    try:
        fence.send_signal(signal.SIGKILL)  # what a Ray worker exiting cleanly does to its direct children
    except ProcessLookupError:
        pass
    fence.wait()
    time.sleep(0.3)
    assert _alive(attempt.pid)  # nothing has happened to the node yet
    world["raylet"].kill()
    world["raylet"].wait()
    wait_for(lambda: not _alive(attempt.pid), timeout=5)
    said = (world["runner"].run_dir(world["key"]) / FENCED_FILE).read_text()
    assert said == "the node's raylet died"


@pytest.mark.parametrize("world", ["low", "high"], indirect=True)
def test_the_fence_ends_the_attempt_when_its_worker_dies(world):
    attempt = world["attempt"]
    os.close(world["write"])  # the worker's end of the pipe: closed however the worker dies
    wait_for(lambda: not _alive(attempt.pid), timeout=5)
    assert _readable(world["gone"], 10.0) and os.read(world["gone"], 1) == b""  # the fence has done all it does
    assert (world["runner"].run_dir(world["key"]) / FENCED_FILE).read_text() == "its Ray worker died"


def test_an_attempt_that_ended_lets_its_fence_go_without_a_kill(world):
    attempt = world["attempt"]
    os.write(world["write"], b"ended")
    assert _readable(world["gone"], 5.0) and os.read  # the fence's own end: gone once it exits(world["gone"], 1) == b""
    assert _alive(attempt.pid)  # "ended" says the actor reaped the tree itself: the fence does nothing
    assert not (world["runner"].run_dir(world["key"]) / FENCED_FILE).exists()
