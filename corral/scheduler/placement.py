"""Gang placement: feasibility filters then scorers, each a small class, over a working
copy of free resources that can be assumed into and rolled back (a what-if pool).

Packing rule: best fit. A replica goes to the feasible node with the fewest free GPUs left
after it (among equals, the one that reached that count first), and CPU-only replicas
prefer nodes without free GPUs. This keeps whole nodes free for large gangs, the
fragmentation that hurts GPU clusters most. ``first_fit`` (the Slurm model's rule) takes
the first feasible node in the cluster's node order instead, as Slurm's cons_tres does
among nodes of equal weight.

Declared ports are a node resource where a node's replicas share one address (as Nomad's
static ports): two replicas holding the same port are never placed on one address, whether
on one node or on two nodes that share it (several Ray or Slurm nodes on one host). Nodes
whose replicas get addresses of their own (``NodeView.address`` None) have no port limit.

Distinct nodes, two ways and one mechanism (the ``avoid`` set of ``place_replica``): a
``distinct`` task's replicas never share a node with another distinct replica of the job
(``sbatch --nodes=N``); a task in gangs (``gang`` > 1, a multi-node service replica) keeps
the members of each gang on distinct nodes, while different gangs may share one. A request
for a gang's waiting members also ``avoid``s the nodes its running members hold."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass

from corral.scheduler.plan import Allocation
from corral.scheduler.features import has_features
from corral.scheduler.snapshot import NodeView, PendingJob, TaskRequest

EPS = 1e-9


def _grid(value: float) -> float:
    """CPUs and memory on a 1e-9 grid, so that undoing a what-if (take, then release) gives
    back exactly the amount it started from instead of drifting by float rounding."""
    return round(value, 9)


@dataclass
class FreeNode:
    view: NodeView
    gpus: set[int]
    cpus: float
    memory: float
    ports: Counter | None = None  # port -> replicas holding it on this node (None: none, the usual case)


class FreePool:
    """Mutable free resources of every node, with assume/undo for what-if placement.

    Nodes are also indexed by how many GPUs they have free (buckets), so best fit is a walk
    from the smallest bucket that can hold a replica instead of a scan of every node; with
    several GPU types, per type too, so a typed replica never walks the other types' nodes.
    A bucket keeps the order in which its nodes reached that count (their ``stamp``), which
    is what lets a walk over a few named nodes (a switch's, a node list's) visit them in the
    order the whole-bucket walk would. ``copy`` is copy-on-write: a what-if pool shares the
    nodes it never changes, so the many reservations of a cycle each cost what they touch,
    not the size of the cluster. ``changed`` logs every node whose free resources moved, once
    an index over the pool (``topology.Rooms``) exists, so the index redoes only those."""

    def __init__(self, nodes: tuple[NodeView, ...] | list[NodeView]):
        free = [FreeNode(n, set(n.free_gpus or ()), _grid(n.free_cpus or 0.0), _grid(n.free_memory or 0.0),
                         Counter(n.held_ports) if n.held_ports else None) for n in nodes]
        self.by_name = {n.view.name: n for n in free}
        self.max_gpus = max((n.view.gpus for n in free), default=0)
        self.buckets: list[dict[str, FreeNode]] = [{} for _ in range(self.max_gpus + 1)]
        for node in free:
            self.buckets[len(node.gpus)][node.view.name] = node
        self.free_gpus = sum(len(n.gpus) for n in free)
        self.index = {n.view.name: i for i, n in enumerate(free)}  # node order, for first fit
        self.stamp = dict(self.index)  # when each node entered its bucket (bucket order)
        self._clock = len(free)
        self.sharing: dict[str, tuple[str, ...]] = {}  # address -> the nodes on it (fixed)
        for node in free:
            if node.view.address is not None:
                self.sharing[node.view.address] = self.sharing.get(node.view.address, ()) + (node.view.name,)
        types = {_type(n.view) for n in free if n.view.gpus}
        self.types = frozenset(types)  # of the nodes with GPUs (lower case; "" for untyped GPUs)
        # GPU type -> buckets of its nodes, only where there is more than one type to tell apart
        self.typed: dict[str, list[dict[str, FreeNode]]] | None = None
        if len(types) > 1:
            self.typed = {t: [{} for _ in range(self.max_gpus + 1)] for t in types}
            for node in free:
                if node.view.gpus:
                    self.typed[_type(node.view)][len(node.gpus)][node.view.name] = node
        self.changed: list[str] = []
        self.shared: dict = {}  # facts about the nodes that never change (same for every copy)
        self.rooms: dict = {}  # topology.Rooms indexes of this pool, by task shape
        self._owned: set[str] | None = None  # None: every node is this pool's own

    @property
    def nodes(self) -> list[FreeNode]:
        return list(self.by_name.values())

    def copy(self) -> FreePool:
        clone = FreePool.__new__(FreePool)
        clone.by_name = dict(self.by_name)
        clone.max_gpus = self.max_gpus
        clone.buckets = [dict(bucket) for bucket in self.buckets]
        clone.free_gpus = self.free_gpus
        clone.index = self.index
        clone.stamp = dict(self.stamp)
        clone._clock = self._clock
        clone.sharing = self.sharing
        clone.types = self.types
        clone.typed = None if self.typed is None else \
            {t: [dict(bucket) for bucket in buckets] for t, buckets in self.typed.items()}
        clone.changed = []
        clone.shared = self.shared
        clone.rooms = {}
        clone._owned = set()
        self._owned = set()  # its nodes are shared now: the original copies before writing too
        return clone

    def _own(self, name: str) -> FreeNode:
        node = self.by_name[name]
        if self._owned is None or name in self._owned:
            return node
        mine = FreeNode(node.view, set(node.gpus), node.cpus, node.memory, Counter(node.ports) if node.ports else None)
        self.by_name[name] = mine
        self.buckets[len(mine.gpus)][name] = mine
        if self.typed is not None and mine.view.gpus:
            self.typed[_type(mine.view)][len(mine.gpus)][name] = mine
        self._owned.add(name)
        return mine

    def views(self) -> tuple[NodeView, ...]:
        """The pool as the scheduler's input: each node with what is free on it now."""
        return tuple(NodeView(n.view.name, n.view.gpus, n.view.cpus, n.view.memory, n.view.gpu_type, n.view.labels,
                              frozenset(n.gpus), n.cpus, n.memory, n.view.dedicated_to, n.view.address,
                              tuple(sorted(n.ports.elements())) if n.ports else ()) for n in self.by_name.values())

    @classmethod
    def idle(cls, nodes: list[NodeView] | tuple[NodeView, ...]) -> FreePool:
        return cls([NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, n.labels, dedicated_to=n.dedicated_to,
                             address=n.address) for n in nodes])

    def candidates(self, gpus: int, first_fit: bool = False, gpu_type: str | None = None):
        """Nodes with at least ``gpus`` free, fewest free first (best fit), or in node order;
        only nodes of ``gpu_type`` (lower case) when given and the pool tells types apart
        (the other nodes would fail ``GpuTypeFilter`` anyway)."""
        buckets = self.buckets
        if gpu_type is not None and gpus and self.typed is not None:
            buckets = self.typed.get(gpu_type, ())
        elif gpu_type is not None and gpus and gpu_type not in self.types:
            return  # the pool's one type is another: every node would fail GpuTypeFilter
        if first_fit:
            yield from sorted((n for bucket in buckets[gpus:] for n in bucket.values()),
                              key=lambda n: self.index[n.view.name])
            return
        for bucket in buckets[gpus:]:
            yield from bucket.values()

    def among(self, names, gpus: int, first_fit: bool = False) -> list[FreeNode]:
        """The nodes of ``names`` with at least ``gpus`` free, in the order ``candidates``
        gives them: a few named nodes without walking the whole pool."""
        by_name = self.by_name
        nodes = [node for name in names if (node := by_name.get(name)) is not None and len(node.gpus) >= gpus]
        if first_fit:
            index = self.index
            nodes.sort(key=lambda n: index[n.view.name])
        else:
            stamp = self.stamp
            nodes.sort(key=lambda n: (len(n.gpus), stamp[n.view.name]))
        return nodes

    def count_with(self, gpus: int) -> int:
        return sum(len(bucket) for bucket in self.buckets[gpus:])

    def slots(self, gpus: int) -> int:
        """How many replicas of ``gpus`` GPUs the free GPUs could hold, node by node (a
        bound: CPUs and memory are not counted)."""
        return sum(len(bucket) * (free // gpus) for free, bucket in enumerate(self.buckets) if free >= gpus)

    def ports_free(self, node: FreeNode, ports: tuple[int, ...]) -> bool:
        """No replica on ``node``'s address (on it, or on a node sharing it) holds any of ``ports``."""
        if not ports or node.view.address is None:
            return True
        held = [n.ports for name in self.sharing[node.view.address] if (n := self.by_name[name]).ports]
        return not any(counts[port] for counts in held for port in ports)

    def assume(self, alloc: Allocation, ports: bool = True) -> None:
        """Take an allocation that must fit; its ports checked unless ``ports`` is False (what
        already runs: replicas placed before ports were a resource may share one)."""
        node = self.by_name[alloc.node]
        missing = set(alloc.gpus) - node.gpus
        if missing or node.cpus + EPS < alloc.cpus or node.memory + EPS < alloc.memory:
            raise ValueError(f"allocation does not fit on {alloc.node}")
        if ports and not self.ports_free(node, alloc.ports):
            raise ValueError(f"a port of {', '.join(map(str, alloc.ports))} is held on {alloc.node}'s address")
        self.take(alloc)

    def take(self, alloc: Allocation) -> None:
        """Remove an allocation's resources without checking they are free (reservations)."""
        node = self._own(alloc.node)
        before = len(node.gpus)
        if self.rooms:  # logged only for the indexes that read it (a long-lived pool keeps none)
            self.changed.append(alloc.node)
        node.gpus -= set(alloc.gpus)
        if alloc.ports:
            node.ports = node.ports or Counter()
            node.ports.update(alloc.ports)
        if alloc.cpus:
            node.cpus = _grid(node.cpus - alloc.cpus)
        if alloc.memory:
            node.memory = _grid(node.memory - alloc.memory)
        self._rebucket(node, before)

    def release(self, alloc: Allocation) -> None:
        if alloc.node not in self.by_name:  # held on a node that left the pool: nothing comes back here
            return
        node = self._own(alloc.node)
        before = len(node.gpus)
        if self.rooms:
            self.changed.append(alloc.node)
        node.gpus |= set(alloc.gpus)
        if alloc.ports and node.ports:
            node.ports.subtract(alloc.ports)
            node.ports += Counter()  # drops the ports no longer held
        if alloc.cpus:
            node.cpus = _grid(node.cpus + alloc.cpus)
        if alloc.memory:
            node.memory = _grid(node.memory + alloc.memory)
        self._rebucket(node, before)

    def release_except(self, alloc: Allocation, keep: set[int]) -> None:
        """Release an allocation but for the GPUs in ``keep`` (held by a reservation)."""
        if alloc.node not in self.by_name:
            return
        node = self._own(alloc.node)
        before = len(node.gpus)
        if self.rooms:
            self.changed.append(alloc.node)
        node.gpus |= set(alloc.gpus) - keep
        if alloc.ports and node.ports:
            node.ports.subtract(alloc.ports)
            node.ports += Counter()
        if alloc.cpus:
            node.cpus = _grid(node.cpus + alloc.cpus)
        if alloc.memory:
            node.memory = _grid(node.memory + alloc.memory)
        self._rebucket(node, before)

    def _rebucket(self, node: FreeNode, before: int) -> None:
        after = len(node.gpus)
        if after != before:
            name = node.view.name
            self.free_gpus += after - before
            del self.buckets[before][name]
            self.buckets[after][name] = node
            self._clock += 1
            self.stamp[name] = self._clock
            if self.typed is not None and node.view.gpus:
                typed = self.typed[_type(node.view)]
                del typed[before][name]
                typed[after][name] = node


def _type(view: NodeView) -> str:
    return (view.gpu_type or "").lower()


class Filter(ABC):
    @abstractmethod
    def feasible(self, node: FreeNode, req: TaskRequest) -> bool: ...


class GpuTypeFilter(Filter):
    def feasible(self, node: FreeNode, req: TaskRequest) -> bool:
        return req.gpu_type is None or req.gpus == 0 or \
            (node.view.gpu_type or "").lower() == req.gpu_type.lower()


class CapacityFilter(Filter):
    def feasible(self, node: FreeNode, req: TaskRequest) -> bool:
        return len(node.gpus) >= req.gpus and node.cpus + EPS >= req.cpus and node.memory + EPS >= req.memory


class NodeChoiceFilter(Filter):
    """``constraint`` (node features), ``nodelist`` and ``exclusive`` (a whole idle node)."""

    def feasible(self, node: FreeNode, req: TaskRequest) -> bool:
        if req.nodes is not None and node.view.name not in req.nodes:
            return False
        if req.constraint and not has_features(node.view.labels, req.constraint):
            return False
        if req.exclusive and (len(node.gpus) < node.view.gpus or node.cpus + EPS < node.view.cpus
                              or node.memory + EPS < node.view.memory):
            return False
        return True


FILTERS: tuple[Filter, ...] = (GpuTypeFilter(), CapacityFilter(), NodeChoiceFilter())


def feasible(pool: FreePool, node: FreeNode, req: TaskRequest) -> bool:
    """Every filter passes, and the declared ports are free on the node's address (a filter
    of the pool rather than of one node: nodes may share an address)."""
    return all(f.feasible(node, req) for f in FILTERS) and pool.ports_free(node, req.ports)


# A replica confined to at most 1/SUBSET of the pool's nodes looks at those nodes alone.
SUBSET = 8


def place_replica(pool: FreePool, req: TaskRequest, rank: int, allowed: frozenset[str] | None = None,
                  first_fit: bool = False, avoid: set[str] | frozenset[str] = frozenset()) -> Allocation | None:
    """Best fit: the first feasible node in the pool's fewest-free-GPUs-first order, or in
    node order with ``first_fit`` (among ``allowed`` nodes, when given: a partition, or the
    switches topology chose; never one in ``avoid``). An exclusive replica takes all of its node."""
    names = allowed if req.nodes is None else req.nodes if allowed is None else req.nodes & allowed
    if names is not None and len(names) * SUBSET <= len(pool.by_name):
        nodes = pool.among(names, req.gpus, first_fit)  # a few nodes: sort them, not walk every bucket
    else:
        nodes = pool.candidates(req.gpus, first_fit, req.gpu_type.lower() if req.gpu_type else None)
    for node in nodes:
        if (allowed is None or node.view.name in allowed) and node.view.name not in avoid \
                and node.view.name not in req.avoid and feasible(pool, node, req):
            ports = req.ports if node.view.address is not None else ()
            if req.exclusive:
                alloc = Allocation(req.name, rank, node.view.name, tuple(sorted(node.gpus)), node.cpus, node.memory,
                                   ports)
                pool.assume(alloc)
                return alloc
            gpus = tuple(sorted(node.gpus)[: req.gpus])
            alloc = Allocation(req.name, rank, node.view.name, gpus, req.cpus, req.memory, ports)
            pool.assume(alloc)
            return alloc
    return None


@dataclass(frozen=True)
class Scope:
    """Where a job may go this cycle: its partition's nodes (None: all), the policy's
    topology levels, and how long it has waited (for ``max_wait`` relaxing)."""

    allowed: frozenset[str] | None = None
    levels: tuple[str, ...] = ()
    waited: float = 0.0
    first_fit: bool = False  # the policy's packing rule (module docstring)


EVERYWHERE = Scope()


def place_gang(pool: FreePool, job: PendingJob, scope: Scope = EVERYWHERE) -> tuple[Allocation, ...] | None:
    """Every replica of every task, or nothing (the pool is left as it was on failure).

    Multi-node tasks go first, each under the fewest switches (``topology``); then the
    other replicas, larger first, so small ones do not fragment the nodes they need."""
    if len(job.tasks) == 1 and job.tasks[0].replicas == 1:  # most jobs: one replica, nothing to order
        alloc = place_replica(pool, job.tasks[0], 0, scope.allowed, scope.first_fit)
        return None if alloc is None else (alloc,)
    from corral.scheduler.topology import place_task  # topology builds on this module

    placed: list[Allocation] = []

    def undo() -> None:
        for done in placed:
            pool.release(done)

    spread = [t for t in job.tasks if t.replicas > 1 and scope.levels] if scope.levels else []
    for task in sorted(spread, key=lambda t: (-t.gpus * t.replicas, -t.cpus)):
        allocs = place_task(pool, task, scope)
        if allocs is None:
            undo()
            return None
        placed.extend(allocs)
    wanted = [(task, rank) for task in job.tasks if task not in spread for rank in range(task.replicas)]
    wanted.sort(key=lambda tr: (-tr[0].gpus, -tr[0].cpus, -tr[0].memory))
    taken: set[str] = {a.node for a in placed if job.task_named(a.task).distinct}
    gangs: dict[tuple[str, int], set[str]] = {}  # (task, gang) -> the nodes its members hold
    for done in placed:
        if job.task_named(done.task).gang > 1:
            gangs.setdefault((done.task, done.rank // job.task_named(done.task).gang), set()).add(done.node)
    for task, rank in wanted:
        mates = gangs.setdefault((task.name, rank // task.gang), set()) if task.gang > 1 else None
        avoid = (taken | mates if mates else taken) if task.distinct else mates or frozenset()
        alloc = place_replica(pool, task, rank, scope.allowed, scope.first_fit, avoid)
        if alloc is None:
            undo()
            return None
        placed.append(alloc)
        if task.distinct:
            taken.add(alloc.node)
        if mates is not None:
            mates.add(alloc.node)
    order = {t.name: i for i, t in enumerate(job.tasks)}
    return tuple(sorted(placed, key=lambda a: (order[a.task], a.rank)))


def why_infeasible(nodes: list[NodeView] | tuple[NodeView, ...], job: PendingJob) -> str | None:
    """None if the gang fits the idle pool; otherwise which resource no node can ever give."""
    if place_gang(FreePool.idle(nodes), job) is not None:
        return None
    for task in job.tasks:
        chosen = [n for n in nodes if NodeChoiceFilter().feasible(FreeNode(n, set(range(n.gpus)), n.cpus, n.memory),
                                                                  task)]
        what = f"task {task.name!r} asks for"
        if not chosen:
            asks = "; ".join(x for x in (f"constraint {task.constraint}" if task.constraint else "",
                                         f"nodes {','.join(sorted(task.nodes))}" if task.nodes is not None else "")
                             if x)
            return f"{what} {asks or 'a whole node'}; no node of the pool matches"
        distinct = sum(t.replicas for t in job.tasks if t.distinct)
        if task.distinct and distinct > len(chosen):
            return (f"the job asks for {distinct} distinct nodes; {len(chosen)} node(s) of the pool match "
                    f"task {task.name!r}")
    for task in job.tasks:
        typed = [n for n in nodes if GpuTypeFilter().feasible(FreeNode(n, set(), 0, 0), task)]
        what = f"task {task.name!r} asks per replica for"
        if not typed:
            types = sorted({n.gpu_type for n in nodes if n.gpu_type and n.gpus}) or ["none"]
            return f"{what} GPU type {task.gpu_type}; the pool has GPU types: {', '.join(types)}"
        checks = (("GPUs", task.gpus, lambda n: n.gpus), ("CPUs", task.cpus, lambda n: n.cpus),
                  ("GB of memory", task.memory, lambda n: n.memory))
        for label, need, have in checks:
            best = max(typed, key=have)
            if have(best) + EPS < need:
                kind = f"{task.gpu_type} " if task.gpu_type and task.gpus else ""
                return f"{what} {need:g} {label}; the largest {kind}node ({best.name}) has {have(best):g}"
    ports = port_shortage(nodes, job) or gang_shortage(nodes, job)
    if ports:
        return ports
    need_gpus = job.gpus
    have_gpus = sum(n.gpus for n in nodes)
    if need_gpus > have_gpus:
        return f"the job needs {need_gpus} GPUs at once; the whole pool has {have_gpus}"
    return "the whole gang cannot be placed on the pool at once (not enough nodes with room for every replica)"


def port_shortage(nodes: list[NodeView] | tuple[NodeView, ...], job: PendingJob) -> str | None:
    """Which declared port more replicas need than the pool has addresses to give it on."""
    if not nodes or any(n.address is None for n in nodes):
        return None  # none yet (an engine provisions them), or replicas there get addresses of their own
    addresses = {n.address for n in nodes}
    holders: Counter = Counter(p for t in job.tasks for p in set(t.ports) for _ in range(t.replicas))
    for port, count in sorted(holders.items()):
        if count > len(addresses):
            return (f"{count} replicas declare port {port}, and the pool's nodes have {len(addresses)} "
                    f"address(es); two replicas cannot listen on one port of one address")
    return None


def gang_shortage(nodes: list[NodeView] | tuple[NodeView, ...], job: PendingJob) -> str | None:
    """Which task in gangs needs more distinct nodes for one gang than the pool has nodes
    that could ever hold one of its members (besides those its running members hold)."""
    for task in job.tasks:
        if task.gang < 2:
            continue
        need = min(task.gang, task.replicas)
        usable = [n for n in nodes if n.name not in task.avoid and
                  all(f.feasible(FreeNode(n, set(range(n.gpus)), n.cpus, n.memory), task) for f in FILTERS)]
        if len(usable) < need:
            beside = f" besides {', '.join(sorted(task.avoid))}, which its running members hold" if task.avoid else ""
            return (f"task {task.name!r} runs service replicas of {task.gang} nodes each (num_nodes: {task.gang} "
                    f"under service:), each member on a node of its own; {len(usable)} node(s) of the pool could "
                    f"hold a member{beside}, and {need} are needed")
    return None
