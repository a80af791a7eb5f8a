"""The local executor with real processes: adoption after a crash must see a dead replica as
dead at once, whatever state its leftover process is in."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

from corral.executors.base import Handle
from corral.executors.local import EXIT_FILE, LocalExecutor


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


def test_an_adopted_zombie_is_reported_dead_during_watch_itself(tmp_path: Path) -> None:
    reports: list[tuple[str, int | None, str]] = []
    executor = LocalExecutor(lambda h, code: reports.append((h.key, code, threading.current_thread().name)))
    pid = _zombie(3)
    try:
        (tmp_path / EXIT_FILE).write_text("7\n")  # the wrapper's record wins over anything else
        handle = Handle("1.side.0.r0", pid, psutil.Process(pid).create_time(), tmp_path)
        assert not executor.alive(handle)
        executor.watch(handle)
        # Reported synchronously, so a restart collects every exit that happened while it was
        # down in one batch, before the lifecycle acts on any of them.
        assert reports == [("1.side.0.r0", 7, threading.current_thread().name)]
        assert not executor.signal(handle, 15)
    finally:
        os.waitpid(pid, 0)
        executor.close()


def test_an_adopted_live_process_is_watched_until_it_exits(tmp_path: Path) -> None:
    reports: list[tuple[str, int | None]] = []
    done = threading.Event()

    def on_exit(handle: Handle, code: int | None) -> None:
        reports.append((handle.key, code))
        done.set()

    executor = LocalExecutor(on_exit)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # lives until the parent closes the pipe
        os.close(write_fd)
        os.read(read_fd, 1)
        os._exit(0)
    os.close(read_fd)
    try:
        handle = Handle("1.main.0.r0", pid, psutil.Process(pid).create_time(), tmp_path)
        assert executor.alive(handle)
        executor.watch(handle)
        assert reports == []
        os.close(write_fd)
        assert done.wait(5)
        assert reports == [("1.main.0.r0", None)]  # no exit file: the code cannot be known
    finally:
        os.waitpid(pid, 0)
        executor.close()


def test_a_recycled_pid_is_not_the_replica(tmp_path: Path) -> None:
    reports: list[int | None] = []
    executor = LocalExecutor(lambda h, code: reports.append(code))
    try:
        me = psutil.Process(os.getpid())
        handle = Handle("1.x.0.r0", os.getpid(), me.create_time() - 100.0, tmp_path)
        assert not executor.alive(handle)
        executor.watch(handle)
        assert reports == [None]
    finally:
        executor.close()
