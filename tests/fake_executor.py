"""An executor with no processes: it records what the control loop asks and lets a test
report what "happened" (started, exited, lost, absent), and change its nodes, so the loop's
handling of the executor contract is tested without a cluster."""

from __future__ import annotations

import threading
from collections import deque

from corral.executors.contract import Binding, Kind, Launch, Observed, Started
from corral.pool import NodeSpec


class FakeExecutor:
    name = "local"

    def __init__(self, nodes: list[NodeSpec], wake, confirm_later: bool = False):
        self._nodes = list(nodes)
        self.version = 0
        self.wake = wake
        self.confirm_later = confirm_later  # starts answer a pending handle, like Ray's
        self.started: list[Launch] = []
        self.signals: list[tuple[str, int]] = []
        self.ended: set[str] = set()  # attempts that ended, their exits not reported yet: signals find them gone
        self.events: deque[Observed] = deque()
        self.lock = threading.Lock()

    # -- what a test does ----------------------------------------------------------------
    def emit(self, event: Observed) -> None:
        self.events.append(event)
        self.wake()

    def drop_node(self, name: str) -> None:
        with self.lock:
            self._nodes = [n for n in self._nodes if n.name != name]
            self.version += 1
        self.wake()

    def keys(self) -> list[str]:
        return [launch.key for launch in self.started]

    # -- the contract ----------------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        with self.lock:
            return list(self._nodes)

    @property
    def inventory_version(self) -> int:
        return self.version

    def bind(self, job_id, replica_id, node, ports, previous) -> Binding:
        return Binding(f"10.0.0.{replica_id}", dict(ports))

    def rendezvous_port(self, node: str) -> int:
        return 29500

    def reserve(self, job_id, generation, slots) -> None:
        return None

    def release(self, job_id: int) -> None:
        return None

    def start(self, launch: Launch) -> Started:
        self.started.append(launch)
        return Started({"key": launch.key, "node": launch.node}, confirmed=not self.confirm_later)

    def adopt(self, attempts) -> None:
        for key, handle in attempts:
            self.emit(Observed(key, Kind.ABSENT if handle is None else Kind.STARTED, handle=handle))

    def signal(self, handle, signum: int) -> bool:
        self.signals.append((handle["key"], signum))
        return handle["key"] not in self.ended

    def drain(self) -> list[Observed]:
        out = []
        while self.events:
            out.append(self.events.popleft())
        return out

    def forget(self, handle) -> None:
        return None

    def publish(self, job_id, nodes, hosts, peers) -> None:
        return None

    def attempt_env(self, job_id: int) -> dict[str, str]:
        return {}

    def exec_probe(self, handle, command, env, cwd, timeout):
        return True, "ok"

    def cleanup_job(self, job_id: int) -> None:
        return None

    def close(self) -> None:
        return None
