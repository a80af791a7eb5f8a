"""The scheduler's placement done the straightforward way, as it was before the indexes that
make a cycle over 10,000 nodes and 50,000 pending jobs cheap (commit 94325c0): every replica
walks the pool's buckets, every multi-node task counts the rooms of every leaf switch by
walking all candidate nodes, every gang goes through the full gang bookkeeping, releases
are inserted with ``insort``, the queue key asks ``Policy.owed``. ``straightforward()``
swaps these in, so a test can compute a plan both ways and require the same plan."""

from __future__ import annotations

from bisect import insort
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Collection, Iterator

import pytest

from corral.scheduler import backfill, core, placement, preemption, topology
from corral.scheduler.placement import EVERYWHERE, FreePool, Scope, feasible
from corral.scheduler.plan import Allocation
from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import PendingJob, TaskRequest
from corral.scheduler.topology import _fits, _switch


def place_replica(pool: FreePool, req: TaskRequest, rank: int, allowed: frozenset[str] | None = None,
                  first_fit: bool = False, avoid: set[str] | frozenset[str] = frozenset()) -> Allocation | None:
    for node in pool.candidates(req.gpus, first_fit):
        if (allowed is None or node.view.name in allowed) and node.view.name not in avoid \
                and feasible(pool, node, req):
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


def place_gang(pool: FreePool, job: PendingJob, scope: Scope = EVERYWHERE) -> tuple[Allocation, ...] | None:
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
    for task, rank in wanted:
        alloc = place_replica(pool, task, rank, scope.allowed, scope.first_fit, taken if task.distinct else frozenset())
        if alloc is None:
            undo()
            return None
        placed.append(alloc)
        if task.distinct:
            taken.add(alloc.node)
    order = {t.name: i for i, t in enumerate(job.tasks)}
    return tuple(sorted(placed, key=lambda a: (order[a.task], a.rank)))


def place_task(pool: FreePool, task: TaskRequest, scope: Scope) -> list[Allocation] | None:
    levels = scope.levels
    want = task.topology
    level = want.level if want is not None and want.level in levels else levels[0]
    required = want is not None and want.required and \
        not (want.max_wait is not None and scope.waited >= want.max_wait)
    leaf_key = levels[0]
    room: dict[str, int] = defaultdict(int)
    members: dict[str, list[str]] = defaultdict(list)
    parent: dict[str, str] = {}
    depth = levels.index(level)
    for node in pool.candidates(task.gpus):
        if scope.allowed is not None and node.view.name not in scope.allowed:
            continue
        if not feasible(pool, node, task):
            continue
        leaf = _switch(node.view.labels, leaf_key, node.view.name)
        room[leaf] += _fits(node, task)
        members[leaf].append(node.view.name)
        parent[leaf] = _switch(node.view.labels, level, node.view.name) if depth else leaf
    if sum(room.values()) < task.replicas:
        return None
    whole = [leaf for leaf, n in room.items() if n >= task.replicas]
    if whole:
        chosen = [min(whole, key=lambda leaf: (room[leaf], leaf))]
    elif required and depth == 0:
        return None
    else:
        groups: dict[str, list[str]] = defaultdict(list)
        for leaf in room:
            groups[parent[leaf] if required or depth else "*"].append(leaf)
        best: list[str] | None = None
        for leaves in groups.values():
            picked, total = [], 0
            for leaf in sorted(leaves, key=lambda x: (-room[x], x)):
                if total >= task.replicas:
                    break
                picked.append(leaf)
                total += room[leaf]
            if total >= task.replicas and (best is None or len(picked) < len(best)):
                best = picked
        if best is None:
            if required:
                return None
            best = sorted(room, key=lambda x: (-room[x], x))
        chosen = best
    placed: list[Allocation] = []
    for leaf in chosen:
        allowed = frozenset(members[leaf])
        while len(placed) < task.replicas:
            alloc = place_replica(pool, task, len(placed), allowed, scope.first_fit,
                                  {a.node for a in placed} if task.distinct else frozenset())
            if alloc is None:
                break
            placed.append(alloc)
    if len(placed) < task.replicas:
        for done in placed:
            pool.release(done)
        return None
    return placed


def timeline_add(self: backfill.Timeline, end: float, allocations: tuple[Allocation, ...]) -> None:
    step = (end, allocations, sum(len(a.gpus) for a in allocations))
    if self._sorted:
        insort(self.releases, step, key=lambda s: s[0])
    else:
        self.releases.append(step)
    self.changes.append(end)


def queue_key(self: Policy, now: float, hungry: Collection[tuple[str, str]] = ()) -> Callable[..., tuple]:
    tiers = {p.name: p.priority_tier for p in self.partitions}
    default_tier = self.default_partition.priority_tier

    def key(partition, submitted_at, job_id, factors, assoc) -> tuple:
        starving = self.owed(factors, now - submitted_at, assoc in hungry)
        return (-tiers.get(partition, default_tier), not starving, submitted_at if starving else 0.0,
                -factors.total, submitted_at, job_id)
    return key


@contextmanager
def straightforward() -> Iterator[None]:
    """Within it, the scheduler places and orders the straightforward way."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (placement, topology):
            patch.setattr(module, "place_replica", place_replica)
        for module in (placement, backfill, core, preemption):
            patch.setattr(module, "place_gang", place_gang)
        patch.setattr(topology, "place_task", place_task)
        patch.setattr(backfill.Timeline, "add", timeline_add)
        patch.setattr(Policy, "queue_key", queue_key)
        yield
