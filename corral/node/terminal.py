"""A process the server starts for ``corral exec`` and ``corral shell``, on its own machine,
driven through a pseudo-terminal or plain pipes: the ``Shell`` of the local and Slurm
executors (on Slurm the process is ``srun --pty``, whose terminal is this one).

With a terminal the process leads a session of its own whose controlling terminal is the
pty (``setsid --ctty``: the kernel's job control then works as in a login: Ctrl-C typed by
the user reaches the foreground job, not the shell; a size set here sends it SIGWINCH).
Without one it leads a process group of its own, stdout and stderr kept apart, and stdin a
pipe the caller closes at its end of input.

Also here: ``ENTER``, the few lines of bash that finish entering a replica's world as its
account (its variables read from fd 4, its working directory, the command or a shell)."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from corral.node.runner import LOAD_ENV

# Run as the replica's account with its variables on fd 4 (NUL-separated NAME=value, written
# by the server): "$1" is where to start, the rest the command (none: an interactive shell).
ENTER = LOAD_ENV + r"""d=$1; shift
cd -- "$d" 2>/dev/null || echo "corral: cannot enter $d; starting in $PWD" >&2
if [ "$#" -eq 0 ]; then if command -v bash >/dev/null 2>&1; then set -- bash; else set -- sh; fi; fi
command -v -- "$1" >/dev/null 2>&1 || { echo "corral: $1: command not found" >&2; exit 127; }
exec "$@"
"""
# the same, with its variables already in its environment (a process of the job's own account)
ENTER_OWN = ENTER.replace(LOAD_ENV, "")

CLOSE_GRACE_S = 2.0
# What a process started here must not inherit from the server (or a Ray worker): signals it
# ignores or blocks (a server started in the background ignores SIGINT, and an ignored signal
# stays ignored through every exec and every shell: Ctrl-C would reach nothing). Dispositions
# and the mask are reset before the command's exec; nothing else is run.
_DEFAULT_SIGNALS = ("import os, signal, sys\n"
                    "signal.pthread_sigmask(signal.SIG_SETMASK, ())\n"
                    "for s in signal.valid_signals():\n"
                    "    try: signal.signal(s, signal.SIG_DFL)\n"
                    "    except (OSError, ValueError, RuntimeError): pass\n"
                    "os.execvp(sys.argv[1], sys.argv[1:])\n")


def exit_code(returncode: int) -> int:
    """A shell's way of saying how a process ended: its code, or 128+N for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def env_file(env: dict[str, str], directory: str | None = None) -> int:
    """A descriptor of ``env`` (as ``LOAD_ENV`` reads it) in a file already unlinked: nothing
    of the job's is ever on a command line or in a process of the server's rights."""
    import tempfile

    fd, path = tempfile.mkstemp(dir=directory, prefix=".shell-env-")  # 0600, the server's
    try:
        os.unlink(path)
        data = memoryview(env_bytes(env))
        while data:
            data = data[os.write(fd, data):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def env_bytes(env: dict[str, str]) -> bytes:
    """``env`` as ``LOAD_ENV`` reads it; a NUL in a name or value is refused (it would split it)."""
    bad = [k for k, v in env.items() if "\0" in k or "\0" in v or "=" in k or not k]
    if bad:
        raise ValueError(f"variables that cannot be passed on: {', '.join(sorted(bad))}")
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


class Terminal:
    """``argv`` started here with ``env`` (its stdin, stdout and stderr a pty of ``rows`` x
    ``cols`` when ``tty``, pipes otherwise); ``env_fd``, if given, becomes its fd 4 (and is
    closed here once it started); ``cleanup`` is called once it ended (files left for it)."""

    def __init__(self, argv: list[str], env: dict[str, str], tty: bool, rows: int = 24, cols: int = 80,
                 cwd: str | None = None, env_fd: int | None = None, cleanup: Callable[[], None] | None = None):
        self.tty = tty
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._master: int | None = None
        fds = (env_fd,) if env_fd is not None else ()
        prefix = [sys.executable, "-I", "-S", "-c", _DEFAULT_SIGNALS]
        if fds:
            prefix += ["bash", "-c", 'exec 4<&"$1"; eval "exec $1<&-"; shift; exec "$@"', "corral-fd", str(env_fd)]
        try:
            if tty:
                master, slave = os.openpty()
                self._master = master
                self._size(slave, rows, cols)
                try:
                    # not a group leader (a child of the server's group): setsid needs no fork,
                    # so the pid is the session's and its process group's
                    self.proc = subprocess.Popen(["setsid", "--ctty", *prefix, *argv], stdin=slave, stdout=slave,
                                                 stderr=slave, env=env, cwd=cwd, close_fds=True, pass_fds=fds)
                finally:
                    os.close(slave)
                self._outputs = {master: 1}
            else:
                self.proc = subprocess.Popen([*prefix, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, env=env, cwd=cwd, close_fds=True,
                                             start_new_session=True, pass_fds=fds)
                self._outputs = {self.proc.stdout.fileno(): 1, self.proc.stderr.fileno(): 2}
        except BaseException:
            if self._master is not None:
                os.close(self._master)
            raise
        finally:
            if env_fd is not None:
                os.close(env_fd)
        self._poll = select.poll()
        for fd in self._outputs:
            self._poll.register(fd, select.POLLIN)
        self._closed = False  # asked to end: no more reads, writes or resizes
        self._reading = False
        self._released = False

    @staticmethod
    def _size(fd: int, rows: int, cols: int) -> None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(1, rows), max(1, cols), 0, 0))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self) -> tuple[int, bytes]:
        with self._lock:
            if self._closed:
                self._release()
                return 0, b""
            self._reading = True
        try:
            while self._outputs and not self._closed:
                # a job it left in the background may keep the pty or a pipe open: once the
                # process itself ended, what is left is read and then its output is over
                ready = self._poll.poll(200)
                if not ready:
                    if self.proc.poll() is not None:
                        self._drop_all()
                    continue
                for fd, _ in ready:
                    try:
                        data = os.read(fd, 65536)
                    except OSError:  # EIO: the pty's other side is closed by everyone
                        data = b""
                    if data:
                        return self._outputs[fd], data
                    self._drop(fd)
                    break
            return 0, b""
        finally:
            with self._lock:
                self._reading = False
                if self._closed:
                    self._release()

    def _drop(self, fd: int) -> None:
        if self._outputs.pop(fd, None) is not None:
            self._poll.unregister(fd)

    def _drop_all(self) -> None:
        for fd in list(self._outputs):
            self._drop(fd)

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            target = self._master if self.tty else (self.proc.stdin.fileno() if self.proc.stdin else None)
            view = memoryview(data)
            try:  # (a write that blocks is ended by ``close``: its process's death closes the other side)
                while view and target is not None:
                    view = view[os.write(target, view):]
            except (OSError, ValueError):  # it closed its input or ended: what it does not read is dropped
                pass

    def close_input(self) -> None:
        with self._lock:
            if not self.tty and not self._closed and self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass

    def resize(self, rows: int, cols: int) -> None:
        with self._lock:
            if self._master is not None and not self._closed:
                self._size(self._master, rows, cols)

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        return exit_code(self.proc.wait())

    def close(self) -> None:
        """End it if it still runs: a hangup, as a closed terminal sends (a shell passes it to
        its jobs; srun ends its step), then SIGKILL to its group after a grace period. Its
        descriptors are closed once no ``read`` is using them (never under a reader's feet,
        where the number could meanwhile name another file)."""
        if self.proc.poll() is None:
            self.signal(signal.SIGHUP if self.tty else signal.SIGTERM)
            deadline = time.monotonic() + CLOSE_GRACE_S
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.signal(signal.SIGKILL)
            self.proc.wait()
        if self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            cleanup()
        with self._lock:
            self._closed = True
            if not self._reading:
                self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._drop_all()
        if self._master is not None:
            os.close(self._master)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
