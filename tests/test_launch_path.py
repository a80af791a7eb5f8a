"""The launch path on the local executor: a wrapper is created inside its attempt's cgroup and
namespaces by the fork helper (no move, so no wait for the kernel), reaped only when the
executor asks, and refused as Popen would refuse it; without the helper, the wrapper moves
itself into its cgroup before the user's first instruction, whichever way its namespaces are
made."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from corral.executors.contract import Kind, Launch
from corral.executors.local.executor import LocalExecutor
from corral.node.forkserver import ForkServer, ForkServerError
from corral.node.proctree import ProcessTrees
from corral.pool import NodeSpec
from corral.settings import Settings


def _executor(tmp_path: Path) -> LocalExecutor:
    settings = Settings(home=tmp_path, db_url="sqlite://")
    return LocalExecutor([NodeSpec(name="n0", gpus=2, cpus=2)], settings, scope=f"lp{os.getpid()}{tmp_path.name[-6:]}")


def test_a_wrapper_that_makes_its_own_namespaces_runs_the_replica_in_its_cgroup(tmp_path: Path) -> None:
    """Without the namespace thread (it could not be made, or srun starts the wrapper), the
    wrapper binds the hosts file with ``mount`` in the background while it moves itself into
    its cgroup: the user's first instruction already sees both."""
    executor = _executor(tmp_path)
    runner = executor.runner
    if runner.trees.mode != "cgroup" or runner.hosts_mode != "mount-namespace":
        executor.close()
        pytest.skip("needs per-attempt cgroups and mount/UTS namespaces (root)")
    if runner._forks is not None:  # no fork helper: the wrapper moves itself
        runner._forks.close()
        runner._forks, runner.trees.moves = None, True
    runner._spawner_tried, runner._spawner = True, None  # no namespace thread: the wrapper's own unshare
    out = tmp_path / "out"
    try:
        executor.publish(17, {"n0"}, "127.9.9.17\tw-0.own w-0\n", "{}")
        for attempt in range(1, 4):
            key = f"17.w.0.a{attempt}"
            executor.start(Launch(key=key, job_id=17, label="w-0", node="n0", gpus=(), cpus=0.1, memory=0.0,
                                  setup=None, run=f"cat /proc/self/cgroup > {out}{attempt}; "
                                                  f"getent hosts w-0.own >> {out}{attempt}",
                                  env={"PATH": os.environ["PATH"], "CORRAL_HOSTNAME": "w-0.own"}))
            events = []
            deadline = time.monotonic() + 60
            while not events and time.monotonic() < deadline:
                events = executor.drain()
                time.sleep(0.02)
            assert [(e.kind, e.code) for e in events] == [(Kind.EXITED, 0)]
            lines = Path(f"{out}{attempt}").read_text().splitlines()
            unified = next(line for line in lines if line.startswith("0::"))
            assert unified.endswith(f"/{key}"), unified
            assert lines[-1].split()[0] == "127.9.9.17"
    finally:
        executor.close()


def _trees(tmp_path: Path) -> ProcessTrees:
    trees = ProcessTrees(f"fs{os.getpid()}{tmp_path.name[-6:]}")
    if trees.mode != "cgroup":
        pytest.skip("needs per-attempt cgroups (root, cgroup v2)")
    return trees


def test_the_fork_helper_starts_a_process_inside_its_cgroup_and_reaps_it_when_asked(tmp_path: Path) -> None:
    trees = _trees(tmp_path)
    forks = ForkServer.create()
    assert forks is not None
    log = tmp_path / "log"
    try:
        group = str(Path(trees.prepare("7.a.0.a1")).parent)
        child = forks.spawn(["sh", "-c", "cat /proc/self/cgroup; echo $X; exit 3"], {"PATH": os.environ["PATH"], "X": "x1"},
                            str(tmp_path), str(log), 0o022, group)
        assert child.wait() == 3
        lines = log.read_text().splitlines()
        assert next(line for line in lines if line.startswith("0::")).endswith("/7.a.0.a1") and lines[-1] == "x1"
        group2 = str(Path(trees.prepare("7.a.0.a2")).parent)
        sleeper = forks.spawn(["sleep", "60"], {"PATH": os.environ["PATH"]}, None, str(log), -1, group2)
        assert sleeper.poll() is None and os.getpgid(sleeper.pid) == sleeper.pid  # its own session and group
        assert psutil.Process(sleeper.pid).ppid() != os.getpid()  # the helper's child, not the server's
        os.kill(sleeper.pid, signal.SIGKILL)
        assert sleeper.wait() == -signal.SIGKILL
    finally:
        forks.close()
        trees.kill("7.a.0.a1")
        trees.kill("7.a.0.a2")


def test_the_fork_helper_refuses_what_popen_refuses_and_starts_nothing(tmp_path: Path) -> None:
    trees = _trees(tmp_path)
    forks = ForkServer.create()
    assert forks is not None
    try:
        group = str(Path(trees.prepare("8.a.0.a1")).parent)
        with pytest.raises(ValueError):
            forks.spawn(["true"], {"PATH": os.environ["PATH"], "BAD": "a\0b"}, None, str(tmp_path / "log"), -1, group)
        with pytest.raises(OSError) as missing:
            forks.spawn(["no-such-program-here"], {"PATH": os.environ["PATH"]}, None, str(tmp_path / "log"), -1, group)
        assert missing.value.errno == 2 and not isinstance(missing.value, ForkServerError)
        with pytest.raises(ForkServerError):  # not a cgroup: the caller starts it the usual way
            forks.spawn(["true"], {"PATH": os.environ["PATH"]}, None, str(tmp_path / "log"), -1, str(tmp_path / "none"))
        assert trees.members("8.a.0.a1") == []
    finally:
        forks.close()
        trees.kill("8.a.0.a1")


def test_a_replica_starts_the_usual_way_once_the_fork_helper_is_gone(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    forks = executor.runner._forks
    if forks is None:
        executor.close()
        pytest.skip("needs per-attempt cgroups (root, cgroup v2) and clone3")
    out = tmp_path / "out"
    try:
        executor.start(Launch(key="9.w.0.a1", job_id=9, label="w-0", node="n0", gpus=(), cpus=0.1, memory=0.0,
                              setup=None, run=f"echo first > {out}1", env={"PATH": os.environ["PATH"]}))
        assert [(e.kind, e.code) for e in _drain(executor)] == [(Kind.EXITED, 0)]
        forks._proc.kill()
        forks._proc.wait()
        executor.start(Launch(key="9.w.0.a2", job_id=9, label="w-0", node="n0", gpus=(), cpus=0.1, memory=0.0,
                              setup=None, run=f"cat /proc/self/cgroup > {out}2; exit 4",
                              env={"PATH": os.environ["PATH"]}))
        assert [(e.kind, e.code) for e in _drain(executor)] == [(Kind.EXITED, 4)]
        assert forks.broken is not None
        assert Path(f"{out}1").read_text() == "first\n"
        assert next(line for line in Path(f"{out}2").read_text().splitlines()
                    if line.startswith("0::")).endswith("/9.w.0.a2")
    finally:
        executor.close()


def _drain(executor: LocalExecutor, timeout: float = 60.0) -> list:
    events: list = []
    deadline = time.monotonic() + timeout
    while not events and time.monotonic() < deadline:
        events = executor.drain()
        time.sleep(0.02)
    return events
