"""The local executor: each replica is a process group in its own session on this machine,
so it outlives a server restart. A small bash wrapper runs ``setup`` then ``run`` and writes
the exit code to a file before it exits, so an exit that happens while the server is down is
still recorded. Exits are observed through pidfds (which also work for adopted processes
that are not our children) on one watcher thread; no polling."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
from pathlib import Path

import psutil

from corral.executors.base import ExitCallback, Handle, Launch

# Traps (not ignores) so the wrapper survives the group signal long enough to record the
# exit code, while its children start with default signal dispositions.
WRAPPER = r"""
trap : TERM INT HUP USR1 USR2 QUIT PIPE
exec 3>&2
rc=0
if [ -n "$2" ]; then { (script=$2; set --; trap - TERM INT HUP USR1 USR2 QUIT PIPE; eval "$script") 2>&3 3>&-; } 2>/dev/null; rc=$?; fi
if [ "$rc" -eq 0 ] && [ -n "$3" ]; then { (script=$3; set --; trap - TERM INT HUP USR1 USR2 QUIT PIPE; eval "$script") 2>&3 3>&-; } 2>/dev/null; rc=$?; fi
printf '%s\n' "$rc" > "$1"
exit "$rc"
"""
# The user's setup and run execute in subshells (a fork, no new bash) with the traps reset,
# so they see default signal handling and no positional arguments of the wrapper; their
# stderr is the log (fd 3) while the wrapper's own "Terminated" notices go to /dev/null. The
# exit file is only read once the wrapper has exited, so a plain write is enough.

EXIT_FILE = "exit_code"
START_TIME_TOLERANCE_S = 0.05


def read_exit_file(run_dir: Path) -> int | None:
    try:
        return int((run_dir / EXIT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def process_start_time(pid: int) -> float | None:
    """The start time of a process that still runs: None for a zombie too. A replica
    adopted after a crash is no child of ours, so when it dies it waits as a zombie until
    its new parent (the machine's init, which in a container may reap late or never)
    reaps it; counting that zombie as alive would report its exit later, on the watcher
    thread, after exits found at once, and the lifecycle would act on a partial picture."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


class LocalExecutor:
    name = "local"

    def __init__(self, on_exit: ExitCallback):
        self._on_exit = on_exit
        self._children: dict[int, subprocess.Popen] = {}
        self._watched: dict[int, tuple[Handle, int]] = {}  # pidfd -> (handle, pid)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()
        self._poll.register(self._wake_r, select.POLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="corral-local-watcher", daemon=True)
        self._thread.start()

    # -- the protocol -------------------------------------------------------------------
    def start(self, launch: Launch) -> Handle:
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        (launch.run_dir / EXIT_FILE).unlink(missing_ok=True)
        cwd = launch.cwd if launch.cwd and os.path.isdir(launch.cwd) else None
        with open(launch.log_path, "ab", buffering=0) as log:
            proc = subprocess.Popen(
                ["bash", "-c", WRAPPER, "corral-replica", str(launch.run_dir / EXIT_FILE),
                 launch.setup or "", launch.run or ""],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                env=launch.env, start_new_session=True, close_fds=True)
        started = process_start_time(proc.pid) or 0.0  # 0.0: it already ended, nothing to adopt
        handle = Handle(launch.key, proc.pid, started, launch.run_dir)
        with self._lock:
            self._children[proc.pid] = proc
        return handle

    def signal(self, handle: Handle, signum: int) -> bool:
        if not self.alive(handle):
            return False
        try:
            os.killpg(handle.pid, signum)
            return True
        except ProcessLookupError:
            return False

    def alive(self, handle: Handle) -> bool:
        with self._lock:
            proc = self._children.get(handle.pid)
        if proc is not None:
            return proc.poll() is None
        started = process_start_time(handle.pid)
        return started is not None and abs(started - handle.started_at) < START_TIME_TOLERANCE_S

    def watch(self, handle: Handle) -> None:
        if handle.pid <= 0:  # never had a process of its own; only its files can tell
            self._report(handle)
            return
        try:
            pidfd = os.pidfd_open(handle.pid)
        except ProcessLookupError:
            self._report(handle)
            return
        # The pid may have been reused since we recorded it: only the same process counts.
        with self._lock:
            own = handle.pid in self._children
        if not own and not self.alive(handle):
            os.close(pidfd)
            self._report(handle)
            return
        with self._lock:
            self._watched[pidfd] = (handle, handle.pid)
            self._poll.register(pidfd, select.POLLIN)
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=2)

    # -- the watcher thread --------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            for fd, _ in self._poll.poll(1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                with self._lock:
                    handle, _pid = self._watched.pop(fd, (None, None))
                    self._poll.unregister(fd)
                os.close(fd)
                if handle is not None:
                    self._report(handle)

    def _report(self, handle: Handle) -> None:
        with self._lock:
            proc = self._children.pop(handle.pid, None)
        code: int | None
        if proc is not None:
            # Reap only after cleaning the group: stragglers the replica left behind are
            # killed like Slurm ends a step, and the zombie keeps the pgid from being reused.
            try:
                os.killpg(handle.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            rc = proc.wait()
            code = read_exit_file(handle.run_dir)
            if code is None:
                code = 128 - rc if rc < 0 else rc
        else:
            code = read_exit_file(handle.run_dir)
        self._on_exit(handle, code)
