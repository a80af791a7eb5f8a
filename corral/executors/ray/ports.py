"""Ports on Ray nodes, as the driver hands them out: a replica's declared ports where they
are free on its node (only a process corral did not start makes one move: the scheduler never
places two of corral's replicas holding one port on one address), and rendezvous ports.
Free ports are asked of the node in batches, so most placements cost no call to it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from corral.executors.contract import LaunchError

PORT_BATCH = 32  # free ports fetched per call to a node
CALL_TIMEOUT_S = 15.0


class NodePorts:
    def __init__(self, ray: Any, free_ports: Any, pinned: Callable[[str], Any]):
        self._ray, self._free_ports, self._pinned = ray, free_ports, pinned
        self._lock = threading.Lock()
        self._handed: dict[str, set[int]] = {}  # node -> ports handed out by this server
        self._pool: dict[str, list[int]] = {}  # node -> ports found free there, not yet handed out

    def take(self, node: str, wanted: list[int], extra: int) -> list[int]:
        """``wanted`` ports where free on ``node`` (else others), then ``extra`` free ones."""
        if not wanted and not extra:
            return []
        with self._lock:
            pool = self._pool.setdefault(node, [])
            if not wanted and len(pool) >= extra:
                ports = [pool.pop() for _ in range(extra)]
                self._handed.setdefault(node, set()).update(ports)
                return ports
            taken = sorted(self._handed.setdefault(node, set()))
        batch = extra + PORT_BATCH
        ref = self._free_ports.options(num_cpus=0, scheduling_strategy=self._pinned(node)).remote(wanted, batch, taken)
        try:
            found = self._ray.get(ref, timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            said = str(exc).strip().splitlines()
            raise LaunchError(f"could not pick ports on {node}: {type(exc).__name__}: {said[-1] if said else ''}"[:300]) \
                from exc
        ports = found[:len(wanted) + extra]
        with self._lock:  # declared ports honoured are the scheduler's to hand out, not this pool's
            handed = self._handed.setdefault(node, set())
            handed.update(p for p in ports[:len(wanted)] if p not in wanted)
            handed.update(ports[len(wanted):])
            self._pool[node] = [p for p in found[len(wanted) + extra:] if p not in handed]
        return ports
