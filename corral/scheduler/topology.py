"""Topology-aware placement of a multi-node task: all its replicas under as few switches
as possible, in a tree of switches named by node labels (the policy's ``topology`` lists
the label keys from the leaf switch up, e.g. ``("leaf", "spine")``).

The rule, per task:
  1. count how many replicas each leaf switch can hold now;
  2. if one leaf can hold them all, use the leaf that holds them with the least room to
     spare (best fit, keeping emptier leaves whole for bigger tasks);
  3. otherwise take leaves largest first until the task fits, inside the one switch of
     the required (or preferred) level that needs the fewest leaves;
  4. a task that ``requires`` a level and cannot get it waits (reason ``Topology``) until
     its ``max_wait`` has passed; a preferred level is simply tried first.
A task without a ``topology`` prefers one leaf. Nodes without the label are each their
own switch."""

from __future__ import annotations

from collections import defaultdict

from corral.scheduler.placement import EPS, FreePool, Scope, feasible, place_replica
from corral.scheduler.plan import Allocation
from corral.scheduler.snapshot import TaskRequest


def _switch(labels: tuple[tuple[str, str], ...], key: str, node: str) -> str:
    for k, v in labels:
        if k == key:
            return v
    return f"~{node}"


def _fits(node, req: TaskRequest) -> int:
    """How many replicas of ``req`` the node can take now."""
    counts = []
    if req.gpus:
        counts.append(len(node.gpus) // req.gpus)
    if req.cpus > EPS:
        counts.append(int((node.cpus + EPS) // req.cpus))
    if req.memory > EPS:
        counts.append(int((node.memory + EPS) // req.memory))
    if req.ports and node.view.address is not None:
        counts.append(1)  # one replica per address holds a declared port
    fit = min(counts) if counts else req.replicas
    return min(fit, 1) if req.distinct else fit  # distinct replicas: one per node


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
            best = sorted(room, key=lambda x: (-room[x], x))  # anywhere, biggest leaves first
        chosen = best
    placed: list[Allocation] = []
    for leaf in chosen:  # fill the chosen switches in order: biggest first
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
