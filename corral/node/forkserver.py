"""Attempts' wrappers started directly inside their cgroup and fresh namespaces, by a small
single-threaded helper process.

Moving a process into a cgroup (a write to ``cgroup.procs``) takes the kernel's
``cgroup_threadgroup_rwsem`` for writing, and a writer that finds no other in the last few
tens of ms first waits for an RCU grace period: 10-15 ms on this project's 2-core machines,
most of what a trivial job waited between its launch and its first instruction. A process
*created* in its cgroup (``clone3`` with ``CLONE_INTO_CGROUP``, Linux 5.7) takes that lock
only for reading: about 1 ms. ``clone3`` also takes ``CLONE_NEWNS | CLONE_NEWUTS``, so the
same call gives the attempt its own mount and UTS namespaces, where the child binds the job's
hosts file over ``/etc/hosts`` and names itself before it executes the wrapper.

Python has no ``clone3``, and a raw one from the server (many threads) would be unsafe: the
child would run Python while other threads' locks (malloc's among them) are copied held. So
the call is made by a helper with one thread, started once per executor (``python -I`` on
this file: the standard library only), which the server asks over a socket, one request at a
time. Its children (the wrappers) are reaped only when the server asks (``wait``), as
``subprocess.Popen`` does, so a wrapper's pid (and process group) is not reused while the
server may still signal it. The helper exits when the server closes its socket (or dies);
wrappers live on in their own sessions, as they do when the server stops.

Anything the helper cannot do (no ``clone3``, a kernel that refuses the flags, the helper
gone) is a ``ForkServerError`` before anything was started, and the caller starts the
wrapper the usual way."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from typing import Any


class ForkServerError(OSError):
    """The helper could not start the process, and nothing was started."""


class ForkServer:
    """The server's side: asks the helper to start, poll and reap processes."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), str(theirs.fileno())],
                                          pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            theirs.close()
        self._sock = ours
        self._file = ours.makefile("rwb")
        self._lock = threading.Lock()
        self.broken: str | None = None
        try:
            self._ask({"op": "hello"})
        except ForkServerError as exc:
            self.close()
            raise ForkServerError(0, f"the fork helper did not start: {exc}") from None

    @classmethod
    def create(cls) -> ForkServer | None:
        try:
            return cls()
        except (OSError, ValueError):
            return None

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.broken is not None:
                raise ForkServerError(0, self.broken)
            try:
                self._file.write(json.dumps(request).encode() + b"\n")
                self._file.flush()
                line = self._file.readline()
            except (OSError, ValueError) as exc:
                line, why = b"", str(exc)
            else:
                why = "it exited"
            if not line:
                self.broken = f"the fork helper is gone ({why})"
                raise ForkServerError(0, self.broken)
        answer = json.loads(line)
        if "error" in answer:
            raise ForkServerError(answer.get("errno") or 0, answer["error"])
        return answer

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str | None, log: str, umask: int, cgroup: str,
              hosts: str = "", hostname: str = "", namespaces: bool = False) -> Child:
        """Start ``argv`` in its own session inside the cgroup directory ``cgroup`` (with
        ``namespaces``: fresh mount and UTS namespaces, ``hosts`` bound over /etc/hosts,
        named ``hostname``), stdin from /dev/null, stdout and stderr appended to ``log``.
        Raises ``ForkServerError`` (nothing started: the caller may start it otherwise),
        ``OSError`` (the program could not be executed: a bad cwd, no such program) or
        ``ValueError`` (a NUL in an argument or the environment), as ``Popen`` would."""
        for text in [*argv, *env, *env.values()]:
            if "\0" in text:
                raise ValueError("embedded null byte")
        answer = self._ask({"op": "spawn", "argv": argv, "env": env, "cwd": cwd, "log": log, "umask": umask,
                            "cgroup": cgroup, "hosts": hosts, "hostname": hostname, "namespaces": namespaces})
        if "failed" in answer:  # the new process could not become the program: Popen's error
            if answer.get("filename"):
                raise OSError(answer.get("errno") or 0, answer["failed"], answer["filename"])
            raise OSError(answer.get("errno") or 0, answer["failed"])
        return Child(self, int(answer["pid"]))

    def poll(self, pid: int) -> int | None:
        """The exit status of a child that ended (not reaped), or None while it runs."""
        answer = self._ask({"op": "poll", "pid": pid})
        return answer.get("code")

    def reap(self, pid: int) -> int | None:
        """Reap an ended child: its return code as ``Popen.returncode`` gives it, None if unknown."""
        return self._ask({"op": "reap", "pid": pid}).get("code")

    def close(self) -> None:
        with self._lock:
            self.broken = self.broken or "closed"
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class Child:
    """What ``Popen`` offers the executor of a wrapper the helper started: its pid, ``poll``
    and ``wait`` (which reaps it)."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                if self.server.poll(self.pid) is not None:
                    self.returncode = self.server.reap(self.pid)
            except ForkServerError:  # the helper is gone, and with it the child's parent: ended or not ours
                self.returncode = _state_code(self.pid)
        return self.returncode

    def wait(self) -> int | None:
        import time

        while self.poll() is None:
            time.sleep(0.01)
        return self.returncode


def _state_code(pid: int) -> int | None:
    """Without the helper: None while the process runs, else an unknown code (-1)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return -1
    return -1 if state in (b"Z", b"X") else None


# -- the helper -------------------------------------------------------------------------------
# Runs as its own process with one thread; the standard library only.

SYS_CLONE3 = {"x86_64": 435, "aarch64": 435}
CLONE_INTO_CGROUP = 0x200000000
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


def _helper(fd: int) -> None:
    """Everything the new process needs is set up here, in the helper, before ``clone3``: its
    namespaces (the helper enters fresh ones and comes back after), stdio, umask, working
    directory, the program's path and the C arrays of its arguments and environment. The
    child only calls ``setsid`` and ``execve``: a child that ran more Python would copy page
    after page of the helper's memory as it touched objects (several ms)."""
    import ctypes
    import shutil
    import signal
    import struct

    libc = ctypes.PyDLL(None, use_errno=True)  # the GIL stays held: one thread, and the child runs a few lines
    libc.syscall.restype = ctypes.c_long
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.execve.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
    number = SYS_CLONE3.get(os.uname().machine)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them, and the ignoring would be inherited
        signal.signal(signum, signal.SIG_DFL)
    home_mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    home_uts = os.open("/proc/self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
    sock = socket.socket(fileno=fd)
    stream = sock.makefile("rwb")
    broken: list[str] = []  # set once the helper could not come back to its own namespaces

    def answer(reply: dict) -> None:
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def strings(items: list[str]) -> ctypes.Array:
        array = (ctypes.c_char_p * (len(items) + 1))()
        array[:-1] = [os.fsencode(item) for item in items]
        return array

    def enter(req: dict) -> None:
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        if req["hosts"]:
            check(libc.mount(os.fsencode(req["hosts"]), b"/etc/hosts", None, MS_BIND, None),
                  f"binding {req['hosts']} over /etc/hosts")
        if req["hostname"]:
            socket.sethostname(req["hostname"])

    def come_back() -> None:
        try:
            check(libc.setns(home_mnt, CLONE_NEWNS), "returning to the helper's mount namespace")
            check(libc.setns(home_uts, CLONE_NEWUTS), "returning to the helper's UTS namespace")
        except OSError as exc:
            broken.append(str(exc))

    def spawn(req: dict) -> dict:
        if number is None:
            return {"error": f"clone3: unknown system call number on {os.uname().machine}"}
        if broken:
            return {"error": broken[0]}
        env = req["env"]
        program = shutil.which(req["argv"][0], path=env.get("PATH", os.defpath))
        if program is None:
            return {"errno": 2, "failed": "No such file or directory", "filename": req["argv"][0]}
        argv, envp = strings(req["argv"]), strings([f"{k}={v}" for k, v in env.items()])
        path = os.fsencode(program)
        try:
            group = os.open(req["cgroup"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            return {"error": f"clone3: cgroup {req['cgroup']}: {exc.strerror}"}
        saved = [os.dup(0), os.dup(1), os.dup(2)]
        here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        umask = os.umask(req["umask"]) if req["umask"] >= 0 else None
        err_r, err_w = os.pipe()  # close-on-exec: EOF once the program runs
        entered = False
        try:
            try:
                log_fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
                null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                if req["cwd"]:
                    os.chdir(req["cwd"])
            except OSError as exc:
                return {"errno": exc.errno, "failed": exc.strerror, "filename": exc.filename}
            if req["namespaces"]:
                try:
                    entered = True
                    enter(req)
                except OSError as exc:
                    return {"errno": exc.errno, "error": str(exc)}
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(null)
            os.close(log_fd)
            args = struct.pack("=11Q", CLONE_INTO_CGROUP, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, group)
            buf = ctypes.create_string_buffer(args, len(args))
            pid = libc.syscall(number, buf, ctypes.c_size_t(len(args)))
            if pid == 0:  # the child: as little as possible before the program replaces it
                libc.setsid()
                libc.execve(path, argv, envp)
                os.write(2, b"corral: could not execute " + path + b": " + os.strerror(ctypes.get_errno()).encode() + b"\n")
                os._exit(127)
            errno = ctypes.get_errno()
        finally:
            for target, fd_ in enumerate(saved):
                os.dup2(fd_, target, inheritable=False)
                os.close(fd_)
            os.fchdir(here)
            os.close(here)
            if umask is not None:
                os.umask(umask)
            if entered:
                come_back()
            os.close(err_w)
            os.close(group)
        if pid < 0:
            os.close(err_r)
            return {"error": f"clone3: {os.strerror(errno)}"}
        os.close(err_r)
        return {"pid": pid}

    def code(status: int) -> int:
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    while line := stream.readline():
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "hello":
                answer({})
            elif op == "spawn":
                answer(spawn(req))
            elif op == "poll":
                done = os.waitid(os.P_PID, req["pid"], os.WEXITED | os.WNOHANG | os.WNOWAIT)
                answer({"code": None if done is None else done.si_status})
            elif op == "reap":
                _, status = os.waitpid(req["pid"], 0)
                answer({"code": code(status)})
            else:
                answer({"error": f"unknown request {op!r}"})
        except ChildProcessError:
            answer({"code": None})
        except OSError as exc:
            answer({"error": str(exc), "errno": exc.errno})


if __name__ == "__main__":
    _helper(int(sys.argv[1]))
