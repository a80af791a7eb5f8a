"""An attempt's whole process tree, found and ended however its processes fork, detach or
call ``setsid``: a cgroup v2 per attempt where this machine lets us make one (as Slurm's
proctrack/cgroup and container runtimes do), else every process whose environment carries
the attempt's key (``CORRAL_ATTEMPT``), which catches everything but a program that wipes
its own environment. ``kill`` returns only once the tree is gone, or says what survived."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil

ATTEMPT_VAR = "CORRAL_ATTEMPT"


def _cgroup2() -> tuple[Path | None, Path | None]:
    """Where corral may create cgroups (a writable cgroup2 mount: root, or a delegated subtree
    of our own cgroup on a systemd machine), and this process's own cgroup there."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None, None
    own = ""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = line[3:].strip().lstrip("/")
    except OSError:
        pass
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            mount = Path(parts[1])
            for base in (mount, mount / own if own else None):
                if base is not None and base.is_dir() and os.access(base, os.W_OK) \
                        and (base / "cgroup.procs").exists():
                    return base, mount / own
    return None, None


class ProcessTrees:
    def __init__(self, scope: str):
        """``scope`` names this server's subtree (one per CORRAL_HOME)."""
        root, own = _cgroup2()
        self.base: Path | None = None
        if root is not None:
            base = root / f"corral-{scope}"
            try:
                base.mkdir(exist_ok=True)
                self.base = base
            except OSError:
                self.base = None
        self._own_procs = own / "cgroup.procs" if self.base is not None and own is not None else None
        self._warm_wanted = threading.Event()
        self._warmer: threading.Thread | None = None
        self._warmer_lock = threading.Lock()

    @property
    def mode(self) -> str:
        return "cgroup" if self.base is not None else "environment"

    def warm(self) -> None:
        """A move into a cgroup is coming: have the kernel's grace period for it start now, off
        the caller's thread. Every move takes cgroup_threadgroup_rwsem for writing, and a writer
        that finds no other writer in the last few tens of ms first waits for an RCU grace
        period (5-15 ms on a busy machine); writers within that window share one. A no-op move
        of this process into its own cgroup, made just after the attempt's cgroup exists and
        before its wrapper starts, overlaps that wait with the wrapper's own start-up (exec of
        unshare and bash), so the wrapper's move of itself waits only for what is left. Made
        earlier it would gain more, but the move holds the kernel's cgroup lock while it waits,
        and a cgroup made meanwhile (``prepare``) would wait with it. Best effort: without write
        access to our own cgroup nothing happens."""
        if self._own_procs is None:
            return
        self._warm_wanted.set()
        with self._warmer_lock:
            if self._warmer is None:
                self._warmer = threading.Thread(target=self._warm_loop, name="corral-cgroup-warm", daemon=True)
                self._warmer.start()

    def _warm_loop(self) -> None:
        while self._own_procs is not None:
            self._warm_wanted.wait()
            self._warm_wanted.clear()
            try:
                self._own_procs.write_text(str(os.getpid()))
            except OSError:  # not ours to write (or a domain with controllers): never again
                self._own_procs = None

    def prepare(self, key: str) -> str | None:
        """Make the attempt's cgroup; returns the ``cgroup.procs`` path the attempt's first
        process writes itself into (children inherit it), or None without cgroups. Made here
        rather than by the wrapper (one program fewer to start on every launch); it waits only
        while another move holds the kernel's cgroup lock (see ``warm``)."""
        if self.base is None:
            return None
        path = self.base / key
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        return str(path / "cgroup.procs")

    def members(self, key: str, thorough: bool = False) -> list[int]:
        """The attempt's processes; ``thorough`` also looks for ones not (yet) in its cgroup
        (a wrapper caught between spawn and its first line)."""
        found: set[int] = set()
        if self.base is not None and (self.base / key).is_dir():
            try:
                found.update(int(p) for p in (self.base / key / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
            if not thorough:
                return sorted(found)
        return sorted(found | set(self._by_environment(key)))

    def kill(self, key: str, timeout: float = 5.0, thorough: bool = False) -> list[int]:
        """SIGKILL every process of the attempt and wait until none is left; returns the
        pids that survived ``timeout`` (none, unless the kernel holds them in D state)."""
        path = self.base / key if self.base is not None else None
        deadline = time.monotonic() + timeout
        while True:
            pids = self.members(key, thorough)
            if not pids:
                break
            if path is not None and (path / "cgroup.kill").exists():
                try:
                    (path / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() >= deadline:
                return self.members(key)
            time.sleep(0.01)
        if path is not None:
            try:
                path.rmdir()
            except OSError:
                pass
        return []

    def signal(self, key: str, signum: int) -> int:
        """Send ``signum`` to every process of the attempt (like ``scancel --signal`` to a
        step); returns how many received it."""
        sent = 0
        for pid in self.members(key):
            try:
                os.kill(pid, signum)
                sent += 1
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    @staticmethod
    def _by_environment(key: str) -> list[int]:
        out = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(ATTEMPT_VAR) == key and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return out
