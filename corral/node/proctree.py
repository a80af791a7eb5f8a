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


def attempt_mark(scope: str, key: str) -> str:
    """What ``CORRAL_ATTEMPT`` holds in every process of the attempt ``key`` of the server of
    ``scope``, by which its processes are found and ended where no cgroup holds them. A key
    alone is one server's (job ids start at 1 in every home): two servers on one machine (two
    homes, two users, a test suite's workers) ended each other's replicas of the same key."""
    return f"{key}@{scope}"

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
    if [ -n "$2" ] && [ -r "$2" ]; then
      # in the attempt's own cgroup: its members are exactly what is left of the attempt
      while read -r pid; do
        [ "$pid" = "$$" ] && continue
        kill -9 "$pid" 2>/dev/null && found=1
      done < "$2"
    else
      for pid in $(grep -lzxF "CORRAL_ATTEMPT=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
        [ "$pid" = "$$" ] && continue
        kill -9 "$pid" 2>/dev/null && found=1
      done
    fi
    [ -z "$found" ] && return 0
    sleep 0.05
  done
  return 1
}
# ``corral_linger KEY PROCS``: wait while any other process of the attempt KEY lives (found as
# ``corral_reap`` finds them; a pid its own helpers printed is checked to be there still).
# Processes outside the stop signal's reach (a daemon in a session of its own, a `corral
# exec` session) are not signalled again here: a batch script's steps got it from the batch
# shell's relay, and a second SIGTERM can cut a checkpoint short; what is left goes with
# corral's SIGKILL at the end of the grace period.
corral_linger() {
  local pid alive
  while :; do
    alive=""
    if [ -n "$2" ] && [ -r "$2" ]; then
      while read -r pid; do
        [ "$pid" = "$$" ] && continue
        kill -0 "$pid" 2>/dev/null && { alive=1; break; }
      done < "$2"
    else
      for pid in $(grep -lzxF "CORRAL_ATTEMPT=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
        [ "$pid" = "$$" ] && continue
        kill -0 "$pid" 2>/dev/null && { alive=1; break; }
      done
    fi
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
}
"""


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


class _Ahead:
    """One helper thread doing the cgroup work that would otherwise stall a start: making the
    cgroups of attempts placed here, taking the kernel's grace period for moves into them (see
    ``ProcessTrees.warm``), and removing the cgroups an ended job left empty. Each of these
    takes the kernel's cgroup lock, which a move holds through its grace period, so on the
    control loop's thread any of them could wait 5-15 ms behind another attempt's move.

    After a warm-up it keeps the lock in its fast mode for ``keep_s``: a no-op move every
    ``period_s``, shorter than the window a move leaves open (one grace period: 12-20 ms
    measured idle here). Without it every start after a pause of some 20 ms paid the grace
    period again, and a warm-up made at submission or placement starts it only a few ms
    before the wrapper's own move (idle, one task: submit -> running 21-23 ms, 10-12 ms kept
    warm; docs/benchmarks.md). A kept-warm second costs ~200 writes (~0.5 % of a core)."""

    def __init__(self, base: Path, own_procs: Path | None, keep_s: float = 5.0, period_s: float = 0.005):
        self.base = base
        self.own_procs = own_procs
        self.keep_s, self.period_s = keep_s, period_s
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._make: list[str] = []
        self._sweep: list[int] = []
        self._warm = False
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._closed = False

    def ask(self, make: str | None = None, sweep: int | None = None, warm: bool = False) -> None:
        with self._lock:
            if make is not None:
                self._make.append(make)
            if sweep is not None:
                self._sweep.append(sweep)
            self._warm = self._warm or warm
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="corral-cgroups", daemon=True)
                self._thread.start()
        self._wanted.set()

    def close(self) -> None:
        """Its thread ends and its open ``cgroup.procs`` is closed (a server stopping in a
        process that goes on: tests, embedded use)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if thread is not None:
            thread.join(timeout=2)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _run(self) -> None:
        warm_until = moved = 0.0
        while not self._closed:
            keeping = time.monotonic() < warm_until
            if not self._wanted.wait(timeout=max(0.0, moved + self.period_s - time.monotonic()) if keeping else None):
                moved = time.monotonic()
                if not self._move_self():
                    warm_until = 0.0
                continue
            self._wanted.clear()
            with self._lock:
                if self._closed:
                    return
                make, sweep, warm = self._make, self._sweep, self._warm
                self._make, self._sweep, self._warm = [], [], False
            # In the order asked: a job's sweep comes before any later placement of it (a
            # pipeline's next stage), and cgroups are made before the no-op move would hold them up.
            for job_id in sweep:
                for path in self.base.glob(f"{job_id}.*"):
                    try:
                        path.rmdir()  # refused while a process is in it: only empty ones go
                    except OSError:
                        pass
            for key in make:
                _make_cgroup(self.base / key)
            if warm and keeping:  # the window is open: keep it so for longer, no move more
                warm_until = time.monotonic() + self.keep_s
            elif warm and self._move_self():
                moved = time.monotonic()
                warm_until = moved + self.keep_s

    def _move_self(self) -> bool:
        """The no-op move of this process into its own cgroup; False once it cannot be made
        (not ours to write, or a domain with controllers: never tried again)."""
        if self.own_procs is None:
            return False
        try:
            if self._fd is None:
                self._fd = os.open(self.own_procs, os.O_WRONLY)
            os.write(self._fd, str(os.getpid()).encode())  # each write is one move; one open file serves them all
            return True
        except OSError:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self.own_procs = None, None
            return False


def _make_cgroup(path: Path) -> bool:
    if path.is_dir():  # made ahead: an existing cgroup costs no cgroup lock
        return True
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return False
    return True


class ProcessTrees:
    def __init__(self, scope: str):
        """``scope`` names this server's subtree (one per CORRAL_HOME)."""
        self.scope = scope
        root, own = _cgroup2()
        self.base: Path | None = None
        if root is not None:
            base = root / f"corral-{scope}"
            try:
                base.mkdir(exist_ok=True)
                self.base = base
            except OSError:
                self.base = None
        self._ahead = _Ahead(self.base, own / "cgroup.procs" if own is not None else None) \
            if self.base is not None else None

    @property
    def mode(self) -> str:
        return "cgroup" if self.base is not None else "environment"

    def warm(self) -> None:
        """A move into a cgroup is coming: have the kernel's grace period for it start now, off
        the caller's thread. Every move takes cgroup_threadgroup_rwsem for writing, and a writer
        that finds no other writer in the last few tens of ms first waits for an RCU grace
        period (5-15 ms on a busy machine); writers within that window share one. A no-op move
        of this process into its own cgroup opens the window: made at placement (``expect``),
        one commit before the start, the wrapper's move of itself does not wait; made at the
        start itself, the wait overlaps the wrapper's exec. Best effort: without write access
        to our own cgroup nothing happens. The window is then kept open for a few seconds
        (see ``_Ahead``), so a burst of starts, or a start soon after a submission (the
        intake warms as a request arrives), pays no grace period at all."""
        if self._ahead is not None:
            self._ahead.ask(warm=True)

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()

    def expect(self, key: str) -> None:
        """An attempt was placed here and starts after the loop's next commit: its cgroup is
        made now, then the grace period taken (``warm``), both off the caller's thread. A
        gang's cgroups are all made before that wait begins, so none of its starts waits
        behind the move of another of its replicas."""
        if self._ahead is not None:
            self._ahead.ask(make=key, warm=True)

    def forget_job(self, job_id: int) -> None:
        """The job ended: cgroups made for attempts of it that never started go (off the
        caller's thread; populated ones are refused by the kernel and stay)."""
        if self._ahead is not None:
            self._ahead.ask(sweep=job_id)

    def prepare(self, key: str) -> str | None:
        """Make the attempt's cgroup (unless ``expect`` made it); returns the ``cgroup.procs``
        path the attempt's first process writes itself into (children inherit it), or None
        without cgroups."""
        if self.base is None:
            return None
        path = self.base / key
        return str(path / "cgroup.procs") if _make_cgroup(path) else None

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

    def _by_environment(self, key: str) -> list[int]:
        out, mark = [], attempt_mark(self.scope, key)
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(ATTEMPT_VAR) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return out
