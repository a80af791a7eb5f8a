"""Ports on the hosts of Slurm allocations: a replica's declared ports are its own (the
scheduler never places two replicas holding one port on one address), and the ports this
executor hands out itself — a task's rank-0 rendezvous port (``MASTER_PORT``) — are kept per
host so neither is given twice. A declared port moves only where it was already handed out
as a rendezvous port, and the binding says so."""

from __future__ import annotations

import threading

from corral.executors.contract import Binding, LaunchError

PORT_BASE = 30000  # ports handed out on a host: rendezvous ports, and a declared one that had to move
PORT_SPAN = 20000


class HostPorts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handed: dict[str, set[int]] = {}  # host -> ports handed out there

    def bind(self, host: str, addr: str, ports: dict[str, int], previous: Binding | None) -> Binding:
        with self._lock:
            handed = self._handed.setdefault(host, set())
            if previous is not None and previous.addr == addr and set(previous.ports) == set(ports):
                handed.update(p for name, p in previous.ports.items() if p != ports[name])
                return previous
            chosen, moved = {}, []
            for name, wanted in ports.items():
                port = wanted
                if wanted in handed:
                    port = self._next(host)
                    handed.add(port)
                    moved.append(f"{wanted} was given as a rendezvous port on {host}")
                chosen[name] = port
            return Binding(addr, chosen, "; ".join(moved))

    def rendezvous(self, host: str) -> int:
        with self._lock:
            port = self._next(host)
            self._handed.setdefault(host, set()).add(port)
            return port

    def _next(self, host: str) -> int:
        handed = self._handed.setdefault(host, set())
        start = PORT_BASE + (len(handed) * 7919) % PORT_SPAN
        for i in range(PORT_SPAN):
            port = PORT_BASE + (start - PORT_BASE + i) % PORT_SPAN
            if port not in handed:
                return port
        raise LaunchError(f"no port left on {host}")
