"""Gang placement: feasibility filters then scorers, each a small class, over a working
copy of free resources that can be assumed into and rolled back (a what-if pool).

Packing rule: best fit. A replica goes to the feasible node with the fewest free GPUs left
after it (then fewest free CPUs), and CPU-only replicas prefer nodes without free GPUs. This
keeps whole nodes free for large gangs, the fragmentation that hurts GPU clusters most."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from corral.scheduler.plan import Allocation
from corral.scheduler.snapshot import NodeView, PendingJob, TaskRequest

EPS = 1e-9


@dataclass
class FreeNode:
    view: NodeView
    gpus: set[int]
    cpus: float
    memory: float


class FreePool:
    """Mutable free resources of every node, with assume/undo for what-if placement."""

    def __init__(self, nodes: tuple[NodeView, ...] | list[NodeView]):
        self.nodes = [FreeNode(n, set(n.free_gpus or ()), n.free_cpus or 0.0, n.free_memory or 0.0)
                      for n in nodes]
        self.by_name = {n.view.name: n for n in self.nodes}

    def copy(self) -> FreePool:
        clone = FreePool.__new__(FreePool)
        clone.nodes = [FreeNode(n.view, set(n.gpus), n.cpus, n.memory) for n in self.nodes]
        clone.by_name = {n.view.name: n for n in clone.nodes}
        return clone

    @classmethod
    def idle(cls, nodes: list[NodeView] | tuple[NodeView, ...]) -> FreePool:
        return cls([NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, n.labels) for n in nodes])

    def assume(self, alloc: Allocation) -> None:
        node = self.by_name[alloc.node]
        missing = set(alloc.gpus) - node.gpus
        if missing or node.cpus + EPS < alloc.cpus or node.memory + EPS < alloc.memory:
            raise ValueError(f"allocation does not fit on {alloc.node}")
        node.gpus -= set(alloc.gpus)
        node.cpus -= alloc.cpus
        node.memory -= alloc.memory

    def release(self, alloc: Allocation) -> None:
        node = self.by_name[alloc.node]
        node.gpus |= set(alloc.gpus)
        node.cpus += alloc.cpus
        node.memory += alloc.memory


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


class Scorer(ABC):
    @abstractmethod
    def score(self, node: FreeNode, req: TaskRequest) -> tuple: ...


class BestFitScorer(Scorer):
    """Lower is better: leave the fewest GPUs, then CPUs, free on the chosen node."""

    def score(self, node: FreeNode, req: TaskRequest) -> tuple:
        if req.gpus == 0:
            return (len(node.gpus), node.cpus - req.cpus, node.view.name)
        return (len(node.gpus) - req.gpus, node.cpus - req.cpus, node.view.name)


FILTERS: tuple[Filter, ...] = (GpuTypeFilter(), CapacityFilter())
SCORERS: tuple[Scorer, ...] = (BestFitScorer(),)


def place_replica(pool: FreePool, req: TaskRequest, rank: int) -> Allocation | None:
    best: FreeNode | None = None
    best_score: tuple | None = None
    for node in pool.nodes:
        if all(f.feasible(node, req) for f in FILTERS):
            score = tuple(s.score(node, req) for s in SCORERS)
            if best_score is None or score < best_score:
                best, best_score = node, score
    if best is None:
        return None
    gpus = tuple(sorted(best.gpus)[: req.gpus])
    alloc = Allocation(req.name, rank, best.view.name, gpus, req.cpus, req.memory)
    pool.assume(alloc)
    return alloc


def place_gang(pool: FreePool, job: PendingJob) -> tuple[Allocation, ...] | None:
    """Every replica of every task, or nothing (the pool is left as it was on failure).

    Larger replicas are placed first so small ones do not fragment the nodes they need."""
    wanted = [(task, rank) for task in job.tasks for rank in range(task.replicas)]
    wanted.sort(key=lambda tr: (-tr[0].gpus, -tr[0].cpus, -tr[0].memory))
    placed: list[Allocation] = []
    for task, rank in wanted:
        alloc = place_replica(pool, task, rank)
        if alloc is None:
            for done in placed:
                pool.release(done)
            return None
        placed.append(alloc)
    order = {t.name: i for i, t in enumerate(job.tasks)}
    return tuple(sorted(placed, key=lambda a: (order[a.task], a.rank)))


def why_infeasible(nodes: list[NodeView] | tuple[NodeView, ...], job: PendingJob) -> str | None:
    """None if the gang fits the idle pool; otherwise which resource no node can ever give."""
    if place_gang(FreePool.idle(nodes), job) is not None:
        return None
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
                return f"{what} {need:g} {label}; the largest node ({best.name}) has {have(best):g}"
    need_gpus = job.gpus
    have_gpus = sum(n.gpus for n in nodes)
    if need_gpus > have_gpus:
        return f"the job needs {need_gpus} GPUs at once; the whole pool has {have_gpus}"
    return "the whole gang cannot be placed on the pool at once (not enough nodes with room for every replica)"
