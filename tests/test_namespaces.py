"""Attempts started by the namespace thread (``corral.node.namespaces``): each in fresh mount
and UTS namespaces of its own, with its job's hosts and its own name, while the server's
namespaces, name and /etc/hosts stay as they were; and the wrapper's own namespaces when the
thread cannot be had."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from corral.node.runner import NodeRunner


def _runner(tmp_path: Path, threads: int = 1) -> NodeRunner:
    runner = NodeRunner(tmp_path / "runs", tmp_path / "run", f"ns{os.getpid()}{tmp_path.name[-6:]}",
                        spawn_threads=threads)
    if runner.hosts_mode != "mount-namespace":
        runner.close()
        pytest.skip("this machine gives no mount namespaces (not root, no unshare)")
    return runner


def _start(runner: NodeRunner, tmp_path: Path, key: str, job_id: int, name: str, look_up: str,
           cwd: str | None = None) -> list[str]:
    out = tmp_path / f"{key}.out"
    run = (f"readlink /proc/self/ns/mnt /proc/self/ns/uts > {out}; hostname >> {out}; "
           f"getent hosts {look_up} >> {out} || echo unresolved >> {out}; pwd >> {out}")
    proc = runner.spawn(key, job_id, None, run, {"PATH": os.environ["PATH"], "CORRAL_HOSTNAME": name}, cwd,
                        tmp_path / f"{key}.log", True, 0o022)
    assert proc.wait(timeout=10) == 0
    runner.end_tree(key, proc.pid)
    return out.read_text().splitlines()


def test_each_attempt_gets_fresh_namespaces_and_the_servers_stay_untouched(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    own = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")]
    host, hosts_before = socket.gethostname(), Path("/etc/hosts").read_text()
    try:
        runner.publish(21, "127.9.9.21\ta-0.first a-0\n", "{}")
        runner.publish(22, "127.9.9.22\tb-0.second b-0\n", "{}")
        first = _start(runner, tmp_path, "21.a.0.a1", 21, "a-0.first", "a-0.first")
        second = _start(runner, tmp_path, "22.b.0.a1", 22, "b-0.second", "a-0.first", cwd=str(tmp_path))
        assert runner._spawner is not None and runner._spawner.broken is None  # the thread made them
        assert first[:2] != own and second[:2] != own  # (ids of ended namespaces are reused: not compared)
        assert first[2] == "a-0.first" and first[3].split() == ["127.9.9.21", "a-0.first", "a-0"]
        assert first[4] == os.getcwd()  # no workdir: the server's directory, as before
        # the second job sees its own name and hosts, nothing of the first one's
        assert second[2] == "b-0.second" and second[3] == "unresolved" and second[4] == str(tmp_path)
        assert [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")] == own
        assert socket.gethostname() == host and Path("/etc/hosts").read_text() == hosts_before
        assert subprocess.run(["getent", "hosts", "a-0.first"], capture_output=True).returncode != 0
    finally:
        runner.close()


def test_without_the_namespace_thread_the_wrapper_makes_them(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    runner._spawner_tried = True  # as where the thread could not enter namespaces
    try:
        runner.publish(23, "127.9.9.23\tc-0.third c-0\n", "{}")
        lines = _start(runner, tmp_path, "23.c.0.a1", 23, "c-0.third", "c-0.third")
        assert runner._spawner is None
        assert lines[2] == "c-0.third" and lines[3].split()[0] == "127.9.9.23"
        assert lines[:2] != [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")]
    finally:
        runner.close()


def test_a_start_that_fails_in_the_thread_is_the_callers_error_and_the_thread_goes_on(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    try:
        runner.publish(24, "127.9.9.24\td-0.fourth d-0\n", "{}")
        with pytest.raises(ValueError):  # Popen refuses an environment value with a NUL byte
            runner.spawn("24.d.0.a1", 24, None, "true", {"PATH": os.environ["PATH"], "BAD": "a\0b"}, None,
                         tmp_path / "d.log", True, 0o022)
        assert runner._spawner is not None and runner._spawner.broken is None
        assert [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")] == [
            os.readlink(f"/proc/{os.getpid()}/task/{os.getpid()}/ns/{ns}") for ns in ("mnt", "uts")]
        lines = _start(runner, tmp_path, "24.d.0.a2", 24, "d-0.fourth", "d-0.fourth")
        assert lines[2] == "d-0.fourth" and lines[3].split()[0] == "127.9.9.24"
    finally:
        runner.close()


def test_a_gangs_starts_made_side_by_side_each_get_their_own_namespaces(tmp_path: Path) -> None:
    """Several namespace threads fork at once (``NodeRunner.begin_spawn``): each attempt
    still sees its own name and its job's hosts, and the server's namespaces stay its own."""
    runner = _runner(tmp_path, threads=4)
    own = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")]
    host = socket.gethostname()
    try:
        runner.publish(25, "".join(f"127.9.25.{r}\te-{r}.gang e-{r}\n" for r in range(6)), "{}")
        begun = [runner.begin_spawn(f"25.e.{r}.a1", 25, None, f"hostname > {tmp_path}/e{r}; getent hosts e-{r}.gang"
                                    f" >> {tmp_path}/e{r}", {"PATH": os.environ["PATH"], "CORRAL_HOSTNAME": f"e-{r}.gang"},
                                    None, tmp_path / f"e{r}.log", True, 0o022) for r in range(6)]
        procs = [b.result() for b in begun]
        assert [p.wait(timeout=10) for p in procs] == [0] * 6
        assert len(runner._spawner._threads) == 4 and runner._spawner.broken is None
        for r in range(6):
            name, resolved = (tmp_path / f"e{r}").read_text().splitlines()
            assert name == f"e-{r}.gang" and resolved.split()[0] == f"127.9.25.{r}"
        assert [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "uts")] == own and socket.gethostname() == host
    finally:
        runner.close()
