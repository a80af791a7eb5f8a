"""The loop's side of readiness and liveness probes: which attempts are probed (watched
when they run, forgotten when they end), and the probe results handed back by the prober's
threads (``probes``), collected each cycle for the supervisor to count against each probe's
thresholds. Exec probes run where the attempt runs, through the executor's ``ExecProbes``
capability."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from corral.control.probes import Prober, ProbeTarget
from corral.control.records import JobRec, ReplicaRec
from corral.executors.contract import ExecProbes, Executor, Listening
from corral.metrics import Metrics


class Probes:
    def __init__(self, wake: Callable[[], None], metrics: Metrics):
        self._wake = wake
        self.metrics = metrics
        self.prober = Prober(self._answered)
        self._results: deque[tuple[ProbeTarget, bool, str]] = deque()

    def _answered(self, target: ProbeTarget, ok: bool, detail: str) -> None:  # prober threads
        self._results.append((target, ok, detail))
        self._wake()

    def watch(self, job: JobRec, replica: ReplicaRec, executor: Executor, env: dict[str, str],
              cwd: str | None) -> None:
        service = job.task(replica.task).service
        # a gang's members other than its head listen on nothing: only the head is probed
        probes = [(kind, probe) for kind, probe in (("readiness", service.readiness_of(replica.rank)),
                                                     ("liveness", service.liveness_of(replica.rank)))
                  if probe is not None]
        if not probes:
            return
        handle, label = replica.handle, replica.label

        def run_exec(command: str, timeout: float) -> tuple[bool, str]:  # where the replica runs
            if not isinstance(executor, ExecProbes):
                return False, f"exec probes cannot run where {label} runs ({executor.name})"
            return executor.exec_probe(handle, command, env, cwd, timeout)

        addr = replica.addr or "127.0.0.1"
        other = None
        if isinstance(executor, Listening) and handle is not None:
            def other(port: int) -> str | None:  # noqa: E306 - the replica's own answer, or who gave it
                return executor.answered_by_other(handle, addr, port)

        for kind, probe in probes:
            self.prober.watch(ProbeTarget(replica.launch_key, kind, probe, addr,
                                          dict(replica.ports or service.ports), env, cwd, run_exec, other))

    def wanted(self, job: JobRec, replica: ReplicaRec) -> bool:
        service = job.task(replica.task).service
        return service.readiness_of(replica.rank) is not None or service.liveness_of(replica.rank) is not None

    def forget(self, key: str) -> None:
        self.prober.forget(key)

    def answers(self) -> list[tuple[str, str, bool, str]]:
        """The results since the last call: (attempt key, probe kind, passed, what it said)."""
        out = []
        while self._results:
            target, ok, detail = self._results.popleft()
            if not ok:
                self.metrics.probe_failures.labels(probe=target.kind).inc()
            out.append((target.key, target.kind, ok, detail))
        return out

    def close(self) -> None:
        self.prober.close()
