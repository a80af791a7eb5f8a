"""Readiness and liveness probes, run on their own thread (checks on a small pool) so a
slow probe never stalls the control loop. Results go back to the loop, which counts
consecutive outcomes against each probe's thresholds."""

from __future__ import annotations

import heapq
import itertools
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from corral.spec.service import Probe, resolve_port


@dataclass(frozen=True)
class ProbeTarget:
    key: str  # the replica attempt's launch key
    kind: str  # "readiness" | "liveness"
    probe: Probe
    addr: str
    ports: dict[str, int]
    env: dict[str, str]
    cwd: str | None
    # Runs an exec probe where the replica runs (its executor's node); None: here.
    run_exec: Callable[[str, float], tuple[bool, str]] | None = None
    # Whether the answer on a port came from someone else than the replica (None: from it).
    answered_by_other: Callable[[int], str | None] | None = None


ResultCallback = Callable[[ProbeTarget, bool, str], None]


def run_check(target: ProbeTarget) -> tuple[bool, str]:
    probe = target.probe
    try:
        if probe.http is not None:
            port = resolve_port(probe.http.port, target.ports)
            check = probe.http
            response = httpx.request(check.method, f"http://{target.addr}:{port}{check.path}", timeout=probe.timeout,
                                     headers=check.headers or None,
                                     **({"json": check.body} if check.body is not None else {}))
            if not 200 <= response.status_code < 400:
                return False, f"HTTP {response.status_code}"
            return _own(target, port, f"HTTP {response.status_code}")
        if probe.tcp is not None:
            port = resolve_port(probe.tcp, target.ports)
            with socket.create_connection((target.addr, port), timeout=probe.timeout):
                pass
            return _own(target, port, f"tcp {port} open")
        if target.run_exec is not None:
            return target.run_exec(probe.exec or "true", probe.timeout)
        done = subprocess.run(["bash", "-c", probe.exec or "true"], env=target.env, cwd=target.cwd,
                              capture_output=True, timeout=probe.timeout)
        return done.returncode == 0, f"exit code {done.returncode}"
    except subprocess.TimeoutExpired:
        return False, f"timed out after {probe.timeout:g}s"
    except (OSError, httpx.HTTPError, ValueError) as exc:
        return False, type(exc).__name__ + (f": {exc}" if str(exc) else "")


def _own(target: ProbeTarget, port: int, said: str) -> tuple[bool, str]:
    """A passed HTTP or TCP probe counts only if the replica itself answered."""
    other = target.answered_by_other(port) if target.answered_by_other is not None else None
    return (False, other) if other else (True, said)


class Prober:
    def __init__(self, on_result: ResultCallback, workers: int = 4, clock: Callable[[], float] = time.monotonic):
        self._on_result = on_result
        self._clock = clock
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="corral-probe")
        self._queue: list[tuple[float, int, str, str]] = []  # (due, seq, key, kind)
        self._targets: dict[tuple[str, str], ProbeTarget] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="corral-prober", daemon=True)
        self._thread.start()

    def watch(self, target: ProbeTarget) -> None:
        with self._cond:
            watched = (target.key, target.kind) in self._targets
            self._targets[(target.key, target.kind)] = target
            if watched:  # watched again (adopted once more): its turn in the queue stands
                return
            heapq.heappush(self._queue, (self._clock() + target.probe.initial_delay, next(self._seq), target.key,
                                         target.kind))
            self._cond.notify()

    def forget(self, key: str) -> None:
        with self._cond:
            for kind in ("readiness", "liveness"):
                self._targets.pop((key, kind), None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=2)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._queue or self._queue[0][0] > self._clock()):
                    self._cond.wait(None if not self._queue else max(0.0, self._queue[0][0] - self._clock()))
                if self._closed:
                    return
                _, _, key, kind = heapq.heappop(self._queue)
                target = self._targets.get((key, kind))
            if target is not None:
                self._pool.submit(self._check, target)

    def _check(self, target: ProbeTarget) -> None:
        ok, detail = run_check(target)
        with self._cond:
            current = self._targets.get((target.key, target.kind))
            if current is None:
                return  # forgotten meanwhile (the replica exited or restarted)
            heapq.heappush(self._queue, (self._clock() + current.probe.period, next(self._seq), target.key, target.kind))
            self._cond.notify()
        if current is target:  # else watched anew meanwhile: this answer is stale
            self._on_result(target, ok, detail)
