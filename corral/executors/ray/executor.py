"""The Ray executor as the server holds it: the server's end of the link to its Ray driver
(``driver``), a process of its own started and restarted here. Ray's client library ends
the process it runs in when the cluster's head stays away for a minute; in a process of
its own that ends the driver, never the server, its local partitions or its other infras.

Built without contacting Ray (it waits a few seconds for a first answer, so a healthy
cluster's nodes are known when the server opens), it never raises for an unreachable
cluster: while Ray does not answer, ``unreachable()`` says why, ``nodes()`` is empty (the
loop shows the partitions DOWN with that reason), starts are refused with it, and what the
server asks meanwhile that must still happen (signals, releases, forgets) is kept and done
once Ray answers again. A new driver adopts every attempt the server watches, so an exit or
a loss while Ray was away is reported, and nothing is started twice; a start it confirms
late is reported once.

Names on the cluster and directories on its nodes carry the server's *node scope*: its
home's scope and that home's instance (a random name kept in the home), so a home made anew
never meets an earlier home's actors, groups or files under the same attempt keys."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from corral.executors.contract import (Binding, EventStream, Handle, Kind, Launch, LaunchError, Observed, ShellError,
                                      ShellRequest, Started, Wake)
from corral.executors.ray.relay import RayShell
from corral.pool import NodeSpec

log = logging.getLogger("corral.ray")

CONNECT_S = 6.0  # how long the server's start waits for Ray's first answer before going on without it
DRIVER_START_S = 45.0  # a driver that has not reached Ray by then is replaced
STALE_S = 5.0  # Ray not answering a look at its nodes this long: its partitions are DOWN
REPLACE_S = 30.0  # a driver cut off from Ray this long is replaced (Ray ends it after 60 s anyway)
BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
CALL_S = 120.0  # the longest a call may take (a gang's reservation waits 30 s for Ray)


def instance(home: Path) -> str:
    """This home's instance: made once with the home, so a home deleted and made again at the
    same path gets a new one."""
    path = home / "ray.instance"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    made = secrets.token_hex(4)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # made meanwhile by another process of this home
    with os.fdopen(fd, "w") as fh:
        fh.write(made + "\n")
    return made


class RayExecutor(EventStream):
    name = "ray"

    def __init__(self, config, settings, scope: str, wake: Wake = lambda: None):
        super().__init__(wake)
        from corral.executors.ray.actor import node_dirs

        self.config, self.settings = config, settings
        from corral.executors.ray.plugin import runs_as

        self.user = runs_as(config)  # the account every worker of the cluster runs as
        self.scope = f"{scope}-{instance(settings.home)}"
        self.namespace = config.namespace or f"corral-{scope}"
        self._runtime_dir = node_dirs(self.scope)[2]
        self._lock = threading.RLock()
        self._sending = threading.Lock()  # one message at a time on the link, never under _lock
        self._conn: Connection | None = None
        self._proc: subprocess.Popen | None = None
        self._connected = False
        self._down: str | None = self._say("does not answer yet (connecting)")
        self._stale: str | None = None  # the driver runs but Ray has not answered it for a while
        self._nodes: list[NodeSpec] = []
        self._shown: list[NodeSpec] = []
        self._version = 0
        self._calls: dict[int, list] = {}  # id -> [answered, ok, value]
        self._next = 0
        self._attempts: dict[str, Handle | None] = {}  # attempts the server watches on Ray
        self._confirmed: set[str] = set()  # of those, the ones reported STARTED
        self._ended: set[str] = set()  # attempts reported ended, until forgotten
        self._suppress: set[str] = set()  # a new driver's adoption reports these running again: not news
        self._signals: dict[str, tuple[Handle, int]] = {}  # sent while Ray was away
        self._owed: list[tuple[str, tuple]] = []  # forgets, releases and clean-ups for when Ray answers
        self._docs: dict[int, tuple] = {}  # job -> its last publish, given again to a new driver
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="corral-ray-link", daemon=True)
        self._thread.start()
        self._ready.wait(CONNECT_S)

    def _say(self, what: str) -> str:
        return f"Ray at {self.config.address} {what}"

    # -- reachability and inventory ----------------------------------------------------------
    def unreachable(self) -> str | None:
        with self._lock:
            return self._down or self._stale

    def nodes(self) -> list[NodeSpec]:
        with self._lock:
            return list(self._shown)

    @property
    def inventory_version(self) -> int:
        return self._version

    def _show(self) -> None:
        """What the loop sees: Ray's nodes while it answers, none while it does not."""
        with self._lock:
            shown = [] if (self._down or self._stale) else list(self._nodes)
            if shown == self._shown:
                return
            self._shown = shown
            self._version += 1
        self._wake_loop()

    # -- the driver process ---------------------------------------------------------------------
    def _keep(self) -> None:
        """Run a driver, follow it, and start another when it ends or loses Ray for too long."""
        failures = 0
        while not self._closed.is_set():
            why = self._run_driver()
            with self._lock:
                self._connected = False
                self._down = self._say(f"does not answer: {why}")
                self._stale = None
                calls, self._calls = self._calls, {}
            for slot in calls.values():  # a call the driver took with it fails with the reason
                slot[1], slot[2] = False, LaunchError(self._down)
                slot[0].set()
            self._show()
            if self._closed.is_set():
                return
            log.warning("%s", self._down)
            self._closed.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
            failures += 1

    def _run_driver(self) -> str:
        mine, theirs = socket.socketpair()
        log_path = self.settings.home / "ray-driver.log"
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "corral.executors.ray.link", str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        except OSError as exc:
            return f"its driver could not start ({exc})"
        finally:
            os.close(out)
            theirs.close()
        conn = Connection(os.dup(mine.fileno()))
        mine.close()
        with self._lock:
            self._proc, self._conn = proc, conn
        size = log_path.stat().st_size
        born, cut_off = time.monotonic(), None
        try:
            with self._sending:
                conn.send(("init", {"config": self.config.model_dump(), "home": str(self.settings.home),
                                    "db_url": self.settings.db_url, "scope": self.scope,
                                    "namespace": self.namespace}))
            while not self._closed.is_set():
                if not conn.poll(0.5):
                    if proc.poll() is not None:
                        return _last_words(log_path, size) or f"its driver ended (exit code {proc.returncode})"
                    if not self._connected:
                        waited = time.monotonic() - born
                        if waited > DRIVER_START_S:
                            return f"no answer within {DRIVER_START_S:g}s"
                        said = _last_words(log_path, size) if waited > STALE_S else None
                        if said:
                            with self._lock:
                                self._down = self._say(f"does not answer (trying for {waited:.0f}s: {said})")
                    if cut_off is not None and time.monotonic() - cut_off > REPLACE_S:
                        return f"no answer for {time.monotonic() - cut_off + STALE_S:.0f}s"
                    continue
                message = conn.recv()
                kind = message[0]
                if kind == "answered":
                    stale = message[1] > STALE_S
                    cut_off = (cut_off or time.monotonic()) if stale else None
                    with self._lock:
                        self._stale = self._say(f"does not answer (for {message[1]:.0f}s)") if stale else None
                    self._show()
                elif kind == "events":
                    self._take(message[1])
                elif kind == "nodes":
                    with self._lock:
                        self._nodes, self._stale = message[1], None
                    cut_off = None
                    self._show()
                elif kind == "reply":
                    with self._lock:
                        slot = self._calls.pop(message[1], None)
                    if slot is not None:
                        slot[1], slot[2] = message[2], message[3]
                        slot[0].set()
                elif kind == "ready":
                    with self._lock:
                        self._nodes, self._connected, self._down = message[1], True, None
                    self._show()
                    threading.Thread(target=self._resync, name="corral-ray-resync", daemon=True).start()
                elif kind == "down":
                    return message[1]
            return "the server is stopping"
        except (EOFError, OSError):
            proc.wait()
            return _last_words(log_path, size) or f"its driver ended (exit code {proc.returncode})"
        finally:
            with self._lock:
                self._conn = None
            conn.close()
            if proc.poll() is None and not self._closed.is_set():
                proc.kill()
                proc.wait()

    def _resync(self) -> None:
        """A new driver: it learns what the server published, adopts every attempt the server
        watches (reporting what changed while Ray was away), then does what was kept for it."""
        with self._lock:
            docs = list(self._docs.items())
            attempts = list(self._attempts.items())
            self._suppress = {k for k, _ in attempts if k in self._confirmed}
        try:
            for job_id, args in docs:
                self._call("publish", job_id, *args)
            if attempts:
                self._call("adopt", attempts)
        except LaunchError:
            return  # lost again: the next driver does it
        finally:
            with self._lock:
                self._suppress = set()
        self._ready.set()
        with self._lock:
            owed, self._owed = self._owed, []
            signals, self._signals = self._signals, {}
        for method, args in owed:
            self._quietly(method, *args)
        for handle, signum in signals.values():
            self._quietly("signal", handle, signum)

    def _take(self, events: list[Observed]) -> None:
        for event in events:
            with self._lock:
                if event.kind == Kind.STARTED:
                    self._attempts[event.key] = event.handle or self._attempts.get(event.key)
                    if event.key in self._suppress:
                        self._suppress.discard(event.key)
                        continue
                    self._confirmed.add(event.key)
                else:
                    self._attempts.pop(event.key, None)
                    self._ended.add(event.key)
                    self._confirmed.discard(event.key)
                    self._signals.pop(event.key, None)
            self._emit(event)

    def _call(self, method: str, *args, timeout: float = CALL_S):
        with self._lock:
            conn = self._conn
            if not self._connected or conn is None:
                raise LaunchError(self._down or self._say("does not answer"))
            self._next += 1
            ident, slot = self._next, [threading.Event(), False, None]
            self._calls[ident] = slot
        try:
            with self._sending:
                conn.send(("call", ident, method, args))
        except OSError as exc:
            with self._lock:
                self._calls.pop(ident, None)
            raise LaunchError(self._say(f"does not answer: its driver is gone ({exc})")) from exc
        if not slot[0].wait(timeout):
            with self._lock:
                self._calls.pop(ident, None)
            raise LaunchError(self._say(f"did not answer {method} within {timeout:g}s"))
        if not slot[1]:
            raise slot[2]
        return slot[2]

    def _quietly(self, method: str, *args) -> None:
        """A call that must happen eventually: now if Ray answers, else once it does."""
        try:
            self._call(method, *args)
        except LaunchError:
            with self._lock:
                self._owed.append((method, args))

    # -- the contract ------------------------------------------------------------------------------
    def bind(self, job_id: int, replica_id: int, node: str, ports: dict[str, int],
             previous: Binding | None) -> Binding:
        return self._call("bind", job_id, replica_id, node, ports, previous)

    def rendezvous_port(self, node: str) -> int:
        return self._call("rendezvous_port", node)

    def reserve(self, job_id: int, generation: int, slots) -> None:
        self._call("reserve", job_id, generation, slots)

    def start(self, launch: Launch) -> Started:
        if launch.run_as is not None and launch.run_as.name != self.user:  # refused at submission already
            raise LaunchError(f"the Ray cluster's workers run as {self.user}, not {launch.run_as.name}: "
                              "Ray cannot start a replica as another Unix account")
        started = self._call("start", launch)
        with self._lock:
            if launch.key not in self._ended:  # its LOST may have come with the answer (its node left)
                self._attempts.setdefault(launch.key, started.handle)
        return started

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        with self._lock:
            for key, handle in attempts:
                self._attempts[key] = handle
                self._confirmed.discard(key)  # reported again, once
        try:
            self._call("adopt", attempts)
        except LaunchError:
            pass  # reported once Ray answers: the next driver adopts every attempt watched

    def signal(self, handle: Handle, signum: int) -> bool:
        try:
            return bool(self._call("signal", handle, signum))
        except LaunchError:
            with self._lock:  # delivered once Ray answers (a SIGKILL outranks what came before)
                before = self._signals.get(handle["key"])
                if before is None or before[1] != 9:
                    self._signals[handle["key"]] = (handle, signum)
            return True

    def forget(self, handle: Handle) -> None:
        with self._lock:
            self._attempts.pop(handle.get("key", ""), None)
            self._ended.discard(handle.get("key", ""))
        self._quietly("forget", handle)

    def publish(self, job_id: int, nodes: set[str], hosts: str, peers: str) -> None:
        with self._lock:
            self._docs[job_id] = (nodes, hosts, peers)
        try:
            self._call("publish", job_id, nodes, hosts, peers)
        except LaunchError:
            pass  # given to the next driver

    def attempt_env(self, job_id: int) -> dict[str, str]:
        directory = self._runtime_dir / str(job_id)
        return {"CORRAL_HOSTS_FILE": str(directory / "hosts"), "CORRAL_PEERS_FILE": str(directory / "peers.json")}

    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        try:
            return self._call("exec_probe", handle, command, env, cwd, timeout, timeout=timeout + CALL_S)
        except LaunchError as exc:
            return False, str(exc)

    def open_shell(self, handle: Handle, request: ShellRequest) -> RayShell:
        """A process on the replica's node, started by its actor in its world (``relay``)."""
        data = {"argv": list(request.argv), "env": dict(request.env), "cwd": request.cwd, "tty": request.tty,
                "rows": request.rows, "cols": request.cols}
        try:
            ident = self._call("shell", handle, None, "open", (data,))
        except LaunchError as exc:
            raise ShellError(str(exc)) from None
        return RayShell(lambda op, *args: self._call("shell", handle, ident, op, args))

    def release(self, job_id: int) -> None:
        with self._lock:
            self._docs.pop(job_id, None)
        self._quietly("release", job_id)

    def cleanup_job(self, job_id: int) -> None:
        self._quietly("cleanup_job", job_id)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            conn, proc, connected = self._conn, self._proc, self._connected
        if conn is not None:
            try:
                with self._sending:
                    conn.send(("close",))
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(timeout=10 if connected else 0.1)  # one still reaching Ray has nothing to close
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._thread.join(timeout=5)


def _last_words(log_path: Path, since: int) -> str | None:
    """The driver's last error line (Ray says why it ended its process)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(since)
            text = fh.read()[-20000:].decode(errors="replace")
    except OSError:
        return None
    # without Ray's log prefix ("[time W pid tid] file.h:153: ")
    lines = [re.sub(r"^\[[^\]]*\]\s*(\S+:\d+:\s*)?", "", line.strip()) for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "GCS" in line or "Error" in line or "error" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else None
