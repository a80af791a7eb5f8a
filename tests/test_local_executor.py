"""The local executor on the v2 contract, with real processes: adoption after a crash sees a
dead attempt as dead at once, an attempt that never started is ABSENT (never another
attempt's exit), and an attempt's whole process tree ends before its end is reported."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corral.node.proctree import attempt_mark

from corral.executors.contract import Kind, Launch, LaunchError, Observed, Started
from corral.executors.local.executor import LocalExecutor
from corral.node.runner import EXIT_FILE, STARTED_FILE
from corral.pool import NodeSpec
from corral.settings import Settings


def _executor(tmp_path: Path) -> LocalExecutor:
    settings = Settings(home=tmp_path, db_url="sqlite://")
    return LocalExecutor([NodeSpec(name="n0", gpus=2, cpus=2)], settings, scope=f"t{os.getpid()}{tmp_path.name[-6:]}")


def _launch(key: str, run: str, job_id: int = 1, label: str = "main-0", env: dict | None = None) -> Launch:
    return Launch(key=key, job_id=job_id, label=label, node="n0", gpus=(), cpus=0.1, memory=0.0, setup=None,
                  run=run, env={"PATH": os.environ["PATH"], **(env or {})})


def _wait_events(executor: LocalExecutor, n: int = 1, timeout: float = 10.0) -> list[Observed]:
    out: list[Observed] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += executor.drain()
        time.sleep(0.02)
    return out


def _zombie(exit_code: int) -> int:
    """A child that has exited but is not reaped: what an adopted replica looks like when its
    new parent has not reaped it yet."""
    pid = os.fork()
    if pid == 0:
        os._exit(exit_code)
    for _ in range(200):
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return pid
        time.sleep(0.01)
    raise AssertionError("the child did not exit")


def test_an_adopted_zombie_is_reported_dead_during_adopt_itself(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    pid = _zombie(3)
    try:
        run_dir = tmp_path / "runs" / "1.side.0.a1"
        run_dir.mkdir(parents=True)
        (run_dir / STARTED_FILE).write_text(f"{pid}\n")
        (run_dir / EXIT_FILE).write_text("7\n")  # the wrapper's record wins over anything else
        handle = {"pid": pid, "started_at": psutil.Process(pid).create_time(), "key": "1.side.0.a1"}
        executor.adopt([("1.side.0.a1", handle)])
        # Reported before adopt returns, so a restart sees every exit that happened while it
        # was down in one batch, before the lifecycle acts on any of them.
        assert executor.drain() == [Observed("1.side.0.a1", Kind.EXITED, code=7)]
        assert not executor.signal(handle, 15)
    finally:
        os.waitpid(pid, 0)
        executor.close()


def test_an_adopted_live_process_is_watched_until_it_exits(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # lives until the parent closes the pipe
        os.close(write_fd)
        os.read(read_fd, 1)
        os._exit(0)
    os.close(read_fd)
    try:
        handle = {"pid": pid, "started_at": psutil.Process(pid).create_time(), "key": "1.main.0.a1"}
        executor.adopt([("1.main.0.a1", handle)])
        started = executor.drain()
        assert [e.kind for e in started] == [Kind.STARTED] and started[0].handle["pid"] == pid
        os.close(write_fd)
        events = _wait_events(executor)
        assert [(e.key, e.kind) for e in events] == [("1.main.0.a1", Kind.LOST)]  # no exit file: code unknown
    finally:
        os.waitpid(pid, 0)
        executor.close()


def test_a_recycled_pid_is_not_the_replica(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    try:
        me = psutil.Process(os.getpid())
        handle = {"pid": os.getpid(), "started_at": me.create_time() - 100.0, "key": "1.x.0.a1"}
        executor.adopt([("1.x.0.a1", handle)])
        assert [e.kind for e in executor.drain()] == [Kind.LOST]
        assert psutil.pid_exists(os.getpid())  # and it was not killed for it
    finally:
        executor.close()


def test_an_attempt_that_never_started_is_absent_not_the_previous_attempts_exit(tmp_path: Path) -> None:
    """A restart committed before the crash, launched never: recovery must not read the
    previous attempt's exit file as the new attempt's result."""
    executor = _executor(tmp_path)
    try:
        handle = executor.start(_launch("5.w.0.a1", "exit 3")).handle
        assert [(e.kind, e.code) for e in _wait_events(executor)] == [(Kind.EXITED, 3)]
        assert handle["key"] == "5.w.0.a1"
        executor.adopt([("5.w.0.a2", None)])  # the next attempt's key: nothing ran under it
        assert [e.kind for e in executor.drain()] == [Kind.ABSENT]
    finally:
        executor.close()


def test_a_started_attempt_without_a_stored_handle_is_adopted(tmp_path: Path) -> None:
    """The server died between spawning an attempt and storing its handle."""
    first = _executor(tmp_path)
    first.start(_launch("6.w.0.a1", "sleep 30"))
    _wait_file(tmp_path / "runs" / "6.w.0.a1" / STARTED_FILE)
    first.close()
    second = _executor(tmp_path)
    try:
        second.adopt([("6.w.0.a1", None)])
        events = second.drain()
        assert [e.kind for e in events] == [Kind.STARTED]
        assert second.signal(events[0].handle, signal.SIGKILL)
        # no child of this server, killed before it could record a code: but the SIGKILL was
        # this executor's own, so its end is known (137), not lost
        assert [(e.kind, e.code) for e in _wait_events(second)] == [(Kind.EXITED, 137)]
    finally:
        second.close()


def _detached_child(marker: Path) -> str:
    """A run that leaves a grandchild in its own session (escapes the process group) and
    records its pid."""
    return f"setsid bash -c 'echo $$ > {marker}; exec sleep 300' & sleep 300"


def _wait_file(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def test_a_killed_wrapper_takes_its_whole_tree_with_it(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    marker = tmp_path / "child.pid"
    try:
        handle = executor.start(_launch("7.w.0.a1", _detached_child(marker))).handle
        child = _wait_file(marker)
        os.kill(handle["pid"], signal.SIGKILL)  # the wrapper dies; its detached child would live on
        events = _wait_events(executor)
        assert [e.kind for e in events] == [Kind.EXITED] and events[0].code == 137
        # reported only once nothing of the attempt is left
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        executor.close()


def test_a_wrapper_killed_while_the_server_was_down_leaves_nothing_running(tmp_path: Path) -> None:
    first = _executor(tmp_path)
    marker = tmp_path / "child.pid"
    handle = first.start(_launch("8.w.0.a1", _detached_child(marker))).handle
    child = _wait_file(marker)
    first.close()  # the server goes down; the attempt runs on
    os.kill(handle["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while psutil.pid_exists(handle["pid"]) and psutil.Process(handle["pid"]).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    second = _executor(tmp_path)
    try:
        second.adopt([("8.w.0.a1", handle)])
        assert [e.kind for e in second.drain()] in ([Kind.LOST], [Kind.EXITED])
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        second.close()
        try:
            os.waitpid(handle["pid"], os.WNOHANG)
        except ChildProcessError:
            pass


def test_an_unlaunchable_command_is_a_launch_error_and_leaves_nothing(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    try:
        with pytest.raises(LaunchError):
            executor.start(_launch("9.w.0.a1", "true\0"))
        with pytest.raises(LaunchError, match="not a directory"):
            executor.start(Launch(key="9.w.0.a2", job_id=9, label="w-0", node="n0", gpus=(), cpus=0.1, memory=0.0,
                                  setup=None, run="true", env={}, cwd=str(tmp_path / "missing")))
        assert executor.drain() == []
    finally:
        executor.close()


def test_names_resolve_for_every_program_through_etc_hosts(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    if executor.runner.hosts_mode != "mount-namespace":
        executor.close()
        pytest.skip("this machine gives no mount namespaces (not root, no unshare): names resolve in Python only")
    out = tmp_path / "out.txt"
    try:
        executor.publish(10, {"n0"}, "127.9.9.9\tweb-0.demo web-0\n", "{}")
        executor.start(_launch("10.w.0.a1", f"getent hosts web-0.demo > {out}", job_id=10))
        assert [(e.kind, e.code) for e in _wait_events(executor)] == [(Kind.EXITED, 0)]
        assert out.read_text().split()[:2] == ["127.9.9.9", "web-0.demo"]
        # the name is the job's, not the machine's
        assert subprocess.run(["getent", "hosts", "web-0.demo"], capture_output=True).returncode != 0
    finally:
        executor.close()


def test_an_attempt_caught_before_it_recorded_its_start_is_ended_and_absent(tmp_path: Path) -> None:
    """Adopted before its wrapper's first line ran: it must not run on beside the attempt
    that replaces it."""
    executor = _executor(tmp_path)
    try:
        proc = subprocess.Popen(["bash", "-c", "sleep 30"], start_new_session=True,
                                env={**os.environ, "CORRAL_ATTEMPT": attempt_mark(executor.runner.trees.scope, "11.w.0.a1")})
        executor.adopt([("11.w.0.a1", None)])
        assert [e.kind for e in executor.drain()] == [Kind.ABSENT]
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        executor.close()


def test_another_server_s_attempt_of_the_same_key_is_never_touched(tmp_path: Path) -> None:
    """Two servers on one machine (two homes, two users, two workers of a test suite) number
    their jobs from 1 alike: an attempt found by its key where no cgroup holds it must be this
    server's (a cancel in one home SIGKILLed the other's replica of the same key)."""
    from corral.node.proctree import ProcessTrees

    ours, key = ProcessTrees(f"ours{os.getpid()}"), "1.main.0.a1"
    theirs = subprocess.Popen(["sleep", "30"], start_new_session=True,
                              env={**os.environ, "CORRAL_ATTEMPT": attempt_mark(f"theirs{os.getpid()}", key)})
    mine = subprocess.Popen(["sleep", "30"], start_new_session=True,
                            env={**os.environ, "CORRAL_ATTEMPT": attempt_mark(ours.scope, key)})
    try:
        assert ours.members(key, thorough=True) == [mine.pid]
        assert ours.kill(key, thorough=True) == []
        assert mine.wait(timeout=5) == -signal.SIGKILL
        assert theirs.poll() is None
    finally:
        for proc in (theirs, mine):
            proc.kill()
            proc.wait()


def test_a_replica_is_named_after_itself(tmp_path: Path) -> None:
    """Its hostname is its corral name and resolves to its own address, so a library that
    advertises gethostname() to peers (gloo) gives the replica's address."""
    executor = _executor(tmp_path)
    if executor.runner.hosts_mode != "mount-namespace":
        executor.close()
        pytest.skip("no mount/UTS namespaces here")
    out = tmp_path / "out.txt"
    try:
        executor.publish(12, {"n0"}, "127.9.9.12\tw-0.named w-0\n", "{}")
        executor.start(_launch("12.w.0.a1", f"hostname > {out}; getent hosts $(hostname) >> {out}", job_id=12,
                               env={"CORRAL_HOSTNAME": "w-0.named"}))
        assert [(e.kind, e.code) for e in _wait_events(executor)] == [(Kind.EXITED, 0)]
        name, resolved = out.read_text().splitlines()
        assert name == "w-0.named" and resolved.split()[0] == "127.9.9.12"
        assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != "w-0.named"
    finally:
        executor.close()


def test_a_replica_starts_inside_its_cgroup_named_and_with_its_hosts(tmp_path: Path) -> None:
    """The wrapper's set-up steps overlap (the cgroup move waits for the kernel), yet the user's
    first instruction already runs in the attempt's cgroup, under its name, with its hosts."""
    executor = _executor(tmp_path)
    if executor.runner.trees.mode != "cgroup" or executor.runner.hosts_mode != "mount-namespace":
        executor.close()
        pytest.skip("needs per-attempt cgroups and mount/UTS namespaces (root)")
    out = tmp_path / "out"
    try:
        executor.publish(13, {"n0"}, "127.9.9.13\tw-0.first w-0\n", "{}")
        for attempt in range(1, 6):  # a lost race shows only now and then: several attempts
            key = f"13.w.0.a{attempt}"
            executor.start(_launch(key, f"cat /proc/self/cgroup > {out}{attempt}; hostname >> {out}{attempt}; "
                                        f"getent hosts w-0.first >> {out}{attempt}", job_id=13,
                                   env={"CORRAL_HOSTNAME": "w-0.first"}))
            assert [(e.kind, e.code) for e in _wait_events(executor)] == [(Kind.EXITED, 0)]
            lines = (tmp_path / f"out{attempt}").read_text().splitlines()
            unified = next(line for line in lines if line.startswith("0::"))  # beside v1 hierarchies, if any
            assert unified.endswith(f"/{key}"), unified
            assert lines[-2] == "w-0.first" and lines[-1].split()[0] == "127.9.9.13"
    finally:
        executor.close()


def _until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_placed_attempts_cgroup_is_made_ahead_and_swept_if_it_never_starts(tmp_path: Path) -> None:
    """Placement makes the attempt's cgroup off the loop's thread (its start then makes none);
    a job's end removes the ones of attempts that never started, never a populated one."""
    executor = _executor(tmp_path)
    base = executor.runner.trees.base
    if base is None:
        executor.close()
        pytest.skip("needs per-attempt cgroups (root, cgroup v2)")
    started, never = base / "31.w.0.a1", base / "31.w.1.a1"
    try:
        executor.prepare(started.name)
        executor.prepare(never.name)
        assert _until(lambda: started.is_dir() and never.is_dir())
        handle = executor.start(_launch(started.name, "sleep 30", job_id=31)).handle
        assert _until(lambda: str(handle["pid"]) in (started / "cgroup.procs").read_text().split())
        executor.cleanup_job(31)
        assert _until(lambda: not never.exists())
        assert started.is_dir()  # its process is in it: the kernel refuses, the sweep leaves it
        assert executor.signal(handle, signal.SIGKILL)
        assert [e.kind for e in _wait_events(executor)] == [Kind.EXITED]
        assert not started.exists()  # the attempt's end removes its own cgroup, as before
    finally:
        executor.close()


def test_a_gangs_starts_are_made_together_each_with_its_own_outcome(tmp_path: Path) -> None:
    """``start_gang``: each replica gets what its own ``start`` would have given: those that
    could start run (each under its own name where namespaces are made) and are watched, one
    that could not is its own LaunchError, with nothing of it running."""
    executor = _executor(tmp_path)
    out = tmp_path / "out"
    try:
        executor.publish(14, {"n0"}, "".join(f"127.9.9.{r}\tw-{r}.gang w-{r}\n" for r in range(4)), "{}")
        launches = [_launch(f"14.w.{r}.a1", f"hostname > {out}{r}", job_id=14, label=f"w-{r}",
                            env={"CORRAL_HOSTNAME": f"w-{r}.gang"}) for r in range(4)]
        launches[2] = Launch(key="14.w.2.a1", job_id=14, label="w-2", node="n0", gpus=(), cpus=0.1, memory=0.0,
                             setup=None, run="true", env={}, cwd=str(tmp_path / "missing"))
        outcomes = executor.start_gang(launches)
        assert isinstance(outcomes[2], LaunchError) and "not a directory" in str(outcomes[2])
        started = [outcomes[r] for r in (0, 1, 3)]
        assert all(isinstance(o, Started) and o.confirmed for o in started), outcomes
        assert [o.handle["key"] for o in started] == ["14.w.0.a1", "14.w.1.a1", "14.w.3.a1"]
        events = _wait_events(executor, 3)
        assert sorted((e.key, e.kind, e.code) for e in events) == [
            (f"14.w.{r}.a1", Kind.EXITED, 0) for r in (0, 1, 3)]
        if executor.runner.hosts_mode == "mount-namespace":
            assert [(tmp_path / f"out{r}").read_text().strip() for r in (0, 1, 3)] == ["w-0.gang", "w-1.gang",
                                                                                       "w-3.gang"]
        assert not (tmp_path / "runs" / "14.w.2.a1" / STARTED_FILE).exists()
    finally:
        executor.close()


class _Crash(BaseException):
    """What ends the loop's thread mid-start, as a kill -9 ends the server."""


def test_a_gang_cut_short_leaves_no_started_replica_unwatched(tmp_path: Path, monkeypatch) -> None:
    """The server goes down between a gang's forks: what was already forked is still the
    executor's (its exit is reported, its tree ended), and nothing after the cut starts."""
    executor = _executor(tmp_path)
    real = executor.runner.begin_spawn
    calls = []

    def begin_then_crash(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise _Crash()
        return real(*args, **kwargs)

    monkeypatch.setattr(executor.runner, "begin_spawn", begin_then_crash)
    try:
        with pytest.raises(_Crash):
            executor.start_gang([_launch(f"15.w.{r}.a1", "sleep 0.2", job_id=15, label=f"w-{r}") for r in range(4)])
        events = _wait_events(executor, 2)
        assert sorted((e.key, e.kind, e.code) for e in events) == [(f"15.w.{r}.a1", Kind.EXITED, 0) for r in (0, 1)]
        assert not (tmp_path / "runs" / "15.w.2.a1").exists() and not (tmp_path / "runs" / "15.w.3.a1").exists()
    finally:
        executor.close()


def test_a_gang_cut_short_while_its_forks_are_taken_back_still_watches_the_rest(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """Cut while the gang's forks are being taken back: those after the cut are still taken
    back and watched, so their exits are reported."""
    executor = _executor(tmp_path)
    real = executor._finish
    calls = []

    def finish_then_crash(launch, spawning):
        calls.append(launch.key)
        if len(calls) == 2:
            spawning.result().wait()  # (this one's own process, cut from its watch, ends here)
            raise _Crash()
        return real(launch, spawning)

    monkeypatch.setattr(executor, "_finish", finish_then_crash)
    try:
        with pytest.raises(_Crash):
            executor.start_gang([_launch(f"16.w.{r}.a1", "sleep 0.2", job_id=16, label=f"w-{r}") for r in range(4)])
        events = _wait_events(executor, 3)
        assert sorted((e.key, e.kind, e.code) for e in events) == [
            (f"16.w.{r}.a1", Kind.EXITED, 0) for r in (0, 2, 3)]
    finally:
        executor.close()
