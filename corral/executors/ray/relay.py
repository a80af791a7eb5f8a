"""``corral exec`` and ``corral shell`` on Ray: the process runs on the replica's node, started
by the replica's own actor in the replica's world (its container, or its mount and UTS
namespaces, its working directory and the very environment its wrapper started with), and
its bytes are relayed by calls: server → driver process (``link``) → actor.

* ``NodeShells`` — in the actor: the processes it started (``corral.node.terminal``), each
  read on a thread of its own into a queue, so a read call returns what came within a short
  wait (a long poll) and never holds one of the actor's threads for long.
* ``RayShell`` — on the server: the ``Shell`` the API drives, each of its operations a call
  through the driver, its output fetched in batches."""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from corral.node import container as containers
from corral.node.proctree import ATTEMPT_VAR, attempt_mark
from corral.node.runner import NodeRunner
from corral.node.terminal import ENTER_OWN, Terminal

READ_WAIT_S = 1.0  # a read call's longest wait for output (it returns at once when some comes)
BATCH = 1 << 20  # the most output one read call carries


class NodeShells:
    """The processes started beside one attempt on its node."""

    def __init__(self, runner: NodeRunner):
        self.runner = runner
        self._open: dict[str, tuple[Terminal, queue.Queue]] = {}
        self._lock = threading.Lock()

    def open(self, key: str, pid: int, request: dict) -> str:
        """Start ``request`` (argv, env, cwd, tty, rows, cols) in the world of the attempt whose
        wrapper is ``pid``; its id."""
        run_dir = self.runner.run_dir(key)
        boxed = containers.shell_argv(run_dir, list(request["argv"]), request["tty"], request["env"].get("TERM"))
        if boxed is not None:
            process = Terminal(boxed, {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                       ATTEMPT_VAR: attempt_mark(self.runner.trees.scope, key)},
                               request["tty"], request["rows"], request["cols"])
        else:
            env = _environ(pid) or dict(request["env"])  # what the replica itself started with
            env.pop("CORRAL_RUN_AS", None)
            if "TERM" in request["env"]:
                env["TERM"] = request["env"]["TERM"]
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = request["cwd"] or env.get("HOME") or "/"
            enter = ["nsenter", "-t", str(pid), "-m", "-u", "--"] \
                if self.runner.hosts_mode == "mount-namespace" and os.geteuid() == 0 and shutil.which("nsenter") else []
            argv = [*enter, "bash", "--noprofile", "--norc", "-c", ENTER_OWN, "corral-shell", cwd, *request["argv"]]
            procs = self.runner.trees.base / key / "cgroup.procs" if self.runner.trees.base is not None else None
            if procs is not None and procs.exists():  # in the attempt's tree: it ends with the attempt
                argv = ["sh", "-c", 'echo "$$" > "$1" 2>/dev/null; shift; exec "$@"', "corral-join", str(procs), *argv]
            process = Terminal(argv, env, request["tty"], request["rows"], request["cols"])
        ident = secrets.token_hex(8)
        out: queue.Queue = queue.Queue()
        with self._lock:
            self._open[ident] = (process, out)
        threading.Thread(target=_pump, args=(process, out), daemon=True, name=f"corral-shell-{ident}").start()
        return ident

    def call(self, ident: str, op: str, args: tuple):
        with self._lock:
            found = self._open.get(ident)
        if found is None:
            raise LookupError(f"no process {ident} here (it ended, or its actor was started again)")
        process, out = found
        if op == "read":
            return _batch(out)
        if op == "close":
            with self._lock:
                self._open.pop(ident, None)
            process.close()
            return None
        if op not in ("write", "close_input", "resize", "signal", "wait"):
            raise ValueError(f"no such operation: {op}")
        return getattr(process, op)(*args)

    def close_all(self) -> None:
        with self._lock:
            found, self._open = list(self._open.values()), {}
        for process, _ in found:
            process.close()


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.decode(errors="surrogateescape").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def _pump(process: Terminal, out: queue.Queue) -> None:
    while True:
        kind, data = process.read()
        out.put((kind, data))
        if kind == 0:
            return


def _batch(out: queue.Queue) -> list[tuple[int, bytes]]:
    """What came within ``READ_WAIT_S`` (nothing: []), the same stream's chunks joined."""
    try:
        items = [out.get(timeout=READ_WAIT_S)]
    except queue.Empty:
        return []
    size = len(items[0][1])
    while size < BATCH and items[-1][0] != 0:
        try:
            kind, data = out.get_nowait()
        except queue.Empty:
            break
        if kind == items[-1][0] and kind != 0:
            items[-1] = (kind, items[-1][1] + data)
        else:
            items.append((kind, data))
        size += len(data)
    return items


class RayShell:
    """The server's side of a process on a Ray node: ``call(op, *args)`` reaches its actor."""

    def __init__(self, call: Callable[..., object]):
        self._call = call
        self._pending: deque[tuple[int, bytes]] = deque()
        self._ended = False

    def read(self) -> tuple[int, bytes]:
        while not self._pending:
            if self._ended:
                return 0, b""
            try:
                got = self._call("read")
            except Exception:  # the node or its actor is gone: its output is over
                got = [(0, b"")]
            self._pending.extend((int(k), bytes(d)) for k, d in got)
        kind, data = self._pending.popleft()
        if kind == 0:
            self._ended = True
        return kind, data

    def write(self, data: bytes) -> None:
        self._quietly("write", data)

    def close_input(self) -> None:
        self._quietly("close_input")

    def resize(self, rows: int, cols: int) -> None:
        self._quietly("resize", rows, cols)

    def signal(self, signum: int) -> None:
        self._quietly("signal", signum)

    def wait(self) -> int:
        try:
            return int(self._call("wait"))
        except Exception:
            return 255  # its node is gone: as ssh says of a lost connection

    def close(self) -> None:
        self._quietly("close")

    def _quietly(self, op: str, *args) -> None:
        try:
            self._call(op, *args)
        except Exception:
            pass  # gone: the read that follows says so
