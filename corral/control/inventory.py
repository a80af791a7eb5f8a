"""The executors a server runs replicas on, and the node pool they report.

Each executor reports its own nodes, and that list may change while the server runs (a Ray
node joins or leaves; a Slurm allocation starts or ends). ``refresh`` takes the executors'
lists when any changed: a node that disappears is DOWN (nothing new is placed there), except
nodes provisioned for one job, which leave with their job. Which executor runs a replica is
found from its node, never from an infra's name.

An executor whose engine can be unreachable (``Reachability``: a Ray cluster, a Slurm
controller) says why while it is; every partition declared on that infra is then DOWN with
that reason (its pending jobs wait, saying so), and comes back by itself when the engine
answers again. The other infras run on.

A node whose engine did not answer while a replica was bound to it (``silent``: a Ray worker
that died and is not yet declared dead) gets nothing new for ``SILENT_S``, or until it
leaves the pool, so a job requeued for it is not placed there again at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from corral.control.records import ReplicaRec
from corral.executors.contract import Executor, Kind, Observed, Reachability
from corral.executors.registry import DEFAULT
from corral.pool import NodeSpec, node_views
from corral.scheduler import NodeView

log = logging.getLogger("corral.control")

SILENT_S = 30.0  # a node that did not answer gets nothing new for this long (Ray declares death in 30 s)


class Inventory:
    def __init__(self, executors: dict[str, Executor], partition_infra: Mapping[str, str] | None = None):
        self.executors = executors
        self.partition_infra = dict(partition_infra or {})  # partition -> the infra it declares
        self.unreachable: dict[str, str] = {}  # infra -> why its engine does not answer
        self.down_partitions: dict[str, str] = {}  # partition -> why it is DOWN
        self.nodes: list[NodeSpec] = []
        self.views: tuple[NodeView, ...] = ()
        self.node_infra: dict[str, str] = {}
        self.down_nodes: dict[str, NodeSpec] = {}  # nodes an executor reported once and lost since
        self.down_infra: dict[str, str] = {}  # a DOWN node -> the infra it was on
        self._versions: tuple[int, ...] | None = None
        self.silent: dict[str, float] = {}  # node -> until when (monotonic) it gets nothing new

    def refresh(self, force: bool = False) -> bool:
        """Take the executors' node lists and reachability when any changed; True if they did."""
        unreachable = self._unreachable()
        versions = tuple(e.inventory_version for e in self.executors.values())
        if versions == self._versions and unreachable == self.unreachable and not force:
            return False
        self._versions = versions
        if unreachable != self.unreachable:
            for name, why in unreachable.items():
                if self.unreachable.get(name) != why:
                    log.warning("infra %s is unreachable, its partitions are DOWN: %s", name, why)
            for name in self.unreachable.keys() - unreachable.keys():
                log.info("infra %s answers again: its partitions are UP", name)
            self.unreachable = unreachable
            self.down_partitions = {p: unreachable[infra] for p, infra in self.partition_infra.items()
                                    if infra in unreachable}
        nodes, infra = [], {}
        for name, executor in self.executors.items():
            for node in executor.nodes():
                if node.name not in infra:
                    nodes.append(node)
                    infra[node.name] = name
        for old in self.nodes:
            if old.name not in infra and old.dedicated_to is None:  # a job's provisioned nodes leave with it
                self.down_nodes[old.name] = old
                self.down_infra[old.name] = self.node_infra.get(old.name, DEFAULT)
        for node in nodes:
            self.down_nodes.pop(node.name, None)
        for name in self.silent.keys() - infra.keys():  # it left: when it comes back, it is new
            del self.silent[name]
        self.nodes, self.node_infra, self.views = nodes, infra, node_views(nodes)
        return True

    def mark_silent(self, node: str) -> None:
        """Its engine did not answer for it: nothing new is placed there for a while."""
        if node in self.node_infra:
            self.silent[node] = time.monotonic() + SILENT_S

    def placeable(self) -> tuple[NodeView, ...]:
        """The nodes the scheduler may place on: every node up but the silent ones."""
        if not self.silent:
            return self.views
        clock = time.monotonic()
        for name in [n for n, until in self.silent.items() if until <= clock]:
            del self.silent[name]
        return tuple(v for v in self.views if v.name not in self.silent)

    def _unreachable(self) -> dict[str, str]:
        out = {}
        for name, executor in self.executors.items():
            if not isinstance(executor, Reachability):
                continue
            try:
                why = executor.unreachable()  # cached by the executor: never a call to its engine
            except Exception as exc:  # an executor that cannot say is taken at its word: not answering
                why = f"infra {name} cannot tell whether its engine answers: {type(exc).__name__}: {exc}"
            if why:
                out[name] = why
        return out

    def up(self, node: str | None) -> bool:
        return node in self.node_infra

    def infra_of_node(self, node: str) -> str:
        return self.node_infra.get(node, DEFAULT)

    def for_node(self, node: str) -> Executor:
        return self.executors[self.infra_of_node(node)]

    def of(self, replica: ReplicaRec) -> Executor:
        return self.executors[replica.infra or self.infra_of_node(replica.node or "")]

    def gone(self, infra: str) -> _Gone:
        """Stands in for an infra the site no longer has: its attempts are reported lost."""
        gone = self.executors.get("_gone")
        if not isinstance(gone, _Gone):
            gone = self.executors["_gone"] = _Gone()
        gone.infra = infra
        return gone

    def close(self) -> None:
        for executor in self.executors.values():
            try:
                executor.close()
            except Exception:
                log.exception("closing executor %s failed", executor.name)


class _Gone:
    """Stands in for an infra the site dropped while attempts ran on it: reports them lost,
    unverified (with the infra's configuration gone, nothing can reach them to end them or to
    see that they ended, so their jobs wait, held, for an operator)."""

    name = "gone"
    inventory_version = 0

    def __init__(self) -> None:
        self._events: list[Observed] = []
        self.infra = ""

    def adopt(self, attempts) -> None:  # noqa: ANN001 - see Executor.adopt
        for key, _ in attempts:
            self._events.append(Observed(key, Kind.LOST, reason=f"infra {self.infra!r} is not configured any more",
                                         unverified=True))

    def nodes(self) -> list[NodeSpec]:
        return []

    def drain(self) -> list[Observed]:
        out, self._events = self._events, []
        return out

    def signal(self, handle, signum) -> bool:  # noqa: ANN001
        return False

    def forget(self, handle) -> None:  # noqa: ANN001
        return None

    def release(self, job_id: int) -> None:
        return None

    def cleanup_job(self, job_id: int) -> None:
        return None

    def publish(self, job_id, nodes, hosts, peers) -> None:  # noqa: ANN001
        return None

    def close(self) -> None:
        return None
