"""An attempt's whole process tree, found and ended however its processes fork, detach or
call ``setsid``: a cgroup v2 per attempt where this machine lets us make one (as Slurm's
proctrack/cgroup and container runtimes do), else every process whose environment carries
the attempt's key (``CORRAL_ATTEMPT``), which catches everything but a program that wipes
its own environment. ``kill`` returns only once the tree is gone, or says what survived."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

ATTEMPT_VAR = "CORRAL_ATTEMPT"

# ``corral_reap KEY``: SIGKILL every process of the attempt KEY on this node but the caller,
# found by the key in their environment, until none is left (false if some outlive 5 s). It
# is bash, not Python, because it runs where the attempt runs: the wrapper ends what its
# replica left behind before it records the exit, and on a Slurm node (where no corral may be
# installed, and Slurm's proctrack may not follow a process that called setsid) a step of its
# own ends what a killed step left. Its own helpers (grep, cut) carry the key too, but are
# gone before the pids they print are signalled.
REAP = r"""
corral_reap() {
  local round pid found
  for round in $(seq 1 100); do
    found=""
    for pid in $(grep -lzxF "CORRAL_ATTEMPT=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
      [ "$pid" = "$$" ] && continue
      kill -9 "$pid" 2>/dev/null && found=1
    done
    [ -z "$found" ] && return 0
    sleep 0.05
  done
  return 1
}
"""


def _cgroup2_root() -> Path | None:
    """Where corral may create cgroups: a writable cgroup2 mount (root, or a delegated
    subtree of our own cgroup on a systemd machine)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
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
                    return base
    return None


class ProcessTrees:
    def __init__(self, scope: str):
        """``scope`` names this server's subtree (one per CORRAL_HOME)."""
        root = _cgroup2_root()
        self.base: Path | None = None
        if root is not None:
            base = root / f"corral-{scope}"
            try:
                base.mkdir(exist_ok=True)
                self.base = base
            except OSError:
                self.base = None

    @property
    def mode(self) -> str:
        return "cgroup" if self.base is not None else "environment"

    def prepare(self, key: str) -> str | None:
        """Make the attempt's cgroup; returns the ``cgroup.procs`` path the attempt's first
        process writes itself into (children inherit it), or None without cgroups."""
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
