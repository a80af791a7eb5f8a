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
own switch.

Step 1 is the cost on a large cluster: every node that could hold a replica, for every
multi-node gang. So the counts live in ``Rooms``, one index per pool and task shape, kept
current from the pool's log of changed nodes: a gang redoes only the leaves whose nodes
changed since the last gang of its shape, and finds the best-fitting leaf by its count."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from corral.scheduler.placement import EPS, FreeNode, FreePool, Scope, feasible, place_replica
from corral.scheduler.plan import Allocation
from corral.scheduler.snapshot import TaskRequest


def _switch(labels: tuple[tuple[str, str], ...], key: str, node: str) -> str:
    for k, v in labels:
        if k == key:
            return v
    return f"~{node}"


def _fits(node, req: TaskRequest) -> int:
    """How many replicas of ``req`` the node can take now."""
    if node.view.name in req.avoid:
        return 0
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
    if req.gang > 1:  # at most one member of each gang per node
        fit = min(fit, -(-req.replicas // req.gang))
    return min(fit, 1) if req.distinct else fit  # distinct replicas: one per node


class Rooms:
    """How many replicas of one task shape each leaf switch of a pool can hold now (only
    leaves that can hold one), with the nodes that can, each leaf's parent switch at the
    task's level, and where the leaf first appears in the pool's best-fit walk (the order
    the scan this replaces met them in, which breaks ties between switch groups).

    Built by one walk of the pool's candidates; afterwards ``current`` redoes only the
    leaves of nodes the pool logged as changed."""

    def __init__(self, pool: FreePool, task: TaskRequest, allowed: frozenset[str] | None, leaf_key: str,
                 level: str, depth: int):
        self.task, self.allowed, self.depth = task, allowed, depth
        self.node_leaf, self.leaf_nodes, self.node_parent = _switches(pool, leaf_key, level)
        self.room: dict[str, int] = {}
        self.members: dict[str, frozenset[str]] = {}
        self.parent: dict[str, str] = {}
        self.first: dict[str, tuple[int, int]] = {}
        self.by_room: dict[int, set[str]] = defaultdict(set)
        self.total = 0
        self.seen = len(pool.changed)
        grouped: dict[str, list[FreeNode]] = defaultdict(list)
        for node in pool.candidates(task.gpus, False, task.gpu_type.lower() if task.gpu_type else None):
            if allowed is None or node.view.name in allowed:
                grouped[self.node_leaf[node.view.name]].append(node)
        for leaf, nodes in grouped.items():
            self._count(pool, leaf, nodes)

    def current(self, pool: FreePool) -> Rooms:
        changed = pool.changed
        if self.seen < len(changed):
            dirty = {self.node_leaf[name] for name in changed[self.seen:]}
            self.seen = len(changed)
            by_name, gpus, allowed = pool.by_name, self.task.gpus, self.allowed
            for leaf in dirty:
                self._forget(leaf)
                self._count(pool, leaf, [node for name in self.leaf_nodes[leaf]
                                         if (allowed is None or name in allowed)
                                         and len((node := by_name[name]).gpus) >= gpus])
        return self

    def _forget(self, leaf: str) -> None:
        room = self.room.pop(leaf, 0)
        if room:
            self.by_room[room].discard(leaf)
            self.total -= room
            del self.members[leaf], self.parent[leaf], self.first[leaf]

    def _count(self, pool: FreePool, leaf: str, nodes: Iterable[FreeNode]) -> None:
        task, stamp = self.task, pool.stamp
        room, members, first, last = 0, [], None, None
        for node in nodes:
            if not feasible(pool, node, task):
                continue
            name = node.view.name
            room += _fits(node, task)
            members.append(name)
            at = (len(node.gpus), stamp[name])
            if first is None or at < first:
                first = at
            if last is None or at > last[0]:
                last = (at, name)
        if not members:
            return
        self.room[leaf] = room
        self.by_room[room].add(leaf)
        self.total += room
        self.members[leaf] = frozenset(members)
        self.first[leaf] = first
        # the last node met in the walk set it in the scan (a leaf under two switches of the level)
        self.parent[leaf] = self.node_parent[last[1]] if self.depth else leaf

    def best_whole(self, replicas: int) -> str | None:
        """The leaf that holds all ``replicas`` with the least room to spare (then by name)."""
        fitting = [room for room, leaves in self.by_room.items() if room >= replicas and leaves]
        return min(self.by_room[min(fitting)]) if fitting else None

    def walk_order(self) -> list[str]:
        """The leaves in the order the pool's best-fit walk first meets them."""
        return sorted(self.room, key=self.first.__getitem__)


def _switches(pool: FreePool, leaf_key: str, level: str) -> tuple[dict, dict, dict]:
    """Node -> its leaf switch, leaf -> its nodes (node order), node -> its switch at
    ``level``: fixed for the cycle, so shared by every copy of the pool."""
    key = ("switches", leaf_key, level)
    known = pool.shared.get(key)
    if known is None:
        node_leaf, leaf_nodes, node_parent = {}, defaultdict(list), {}
        for name in pool.index:
            labels = pool.by_name[name].view.labels
            leaf = node_leaf[name] = _switch(labels, leaf_key, name)
            leaf_nodes[leaf].append(name)
            node_parent[name] = _switch(labels, level, name)
        known = pool.shared[key] = (node_leaf, dict(leaf_nodes), node_parent)
    return known


def _rooms(pool: FreePool, task: TaskRequest, allowed: frozenset[str] | None, leaf_key: str, level: str,
           depth: int) -> Rooms:
    # everything of the task that decides whether a node can take a replica, and how many
    counts_all = not task.gpus and task.cpus <= EPS and task.memory <= EPS
    key = (task.gpus, task.cpus, task.memory, task.gpu_type, task.constraint, task.nodes, task.exclusive,
           task.distinct, task.gang, task.avoid, task.replicas if counts_all or task.gang > 1 else None, allowed,
           leaf_key, level if depth else None)
    rooms = pool.rooms.get(key)
    if rooms is None:
        rooms = pool.rooms[key] = Rooms(pool, task, allowed, leaf_key, level, depth)
        return rooms
    return rooms.current(pool)


def place_task(pool: FreePool, task: TaskRequest, scope: Scope) -> list[Allocation] | None:
    levels = scope.levels
    want = task.topology
    level = want.level if want is not None and want.level in levels else levels[0]
    required = want is not None and want.required and \
        not (want.max_wait is not None and scope.waited >= want.max_wait)
    leaf_key = levels[0]
    depth = levels.index(level)
    if task.ports and pool.sharing:
        # a port held on one node closes it on every node of its address, whatever the leaf:
        # counted afresh (declared ports are rare on the large clusters this index is for)
        room, members, parent, order = _scan(pool, task, scope, leaf_key, level, depth)
        whole = [leaf for leaf, n in room.items() if n >= task.replicas]
        fit = min(whole, key=lambda leaf: (room[leaf], leaf)) if whole else None
        total = sum(room.values())
    else:
        rooms = _rooms(pool, task, scope.allowed, leaf_key, level, depth)
        room, members, parent, total = rooms.room, rooms.members, rooms.parent, rooms.total
        fit = rooms.best_whole(task.replicas) if total >= task.replicas else None
        order = None
    if total < task.replicas:
        return None
    if fit is not None:
        chosen = [fit]
    elif required and depth == 0:
        return None
    else:
        groups: dict[str, list[str]] = defaultdict(list)
        if required or depth:
            # groups are tried in the order the walk meets them: the first of equals wins
            for leaf in order if order is not None else rooms.walk_order():
                groups[parent[leaf]].append(leaf)
        else:
            groups["*"] = list(room)
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
            rank = len(placed)
            alloc = place_replica(pool, task, rank, allowed, scope.first_fit,
                                  {a.node for a in placed} if task.distinct else
                                  {a.node for a in placed if a.rank // task.gang == rank // task.gang}
                                  if task.gang > 1 else frozenset())
            if alloc is None:
                break
            placed.append(alloc)
    if len(placed) < task.replicas:
        for done in placed:
            pool.release(done)
        return None
    return placed


def _scan(pool: FreePool, task: TaskRequest, scope: Scope, leaf_key: str, level: str, depth: int):
    """Step 1 by a walk of every candidate node: rooms, members, parents, walk order."""
    room: dict[str, int] = defaultdict(int)
    members: dict[str, list[str]] = defaultdict(list)
    parent: dict[str, str] = {}
    for node in pool.candidates(task.gpus):
        if scope.allowed is not None and node.view.name not in scope.allowed:
            continue
        if not feasible(pool, node, task):
            continue
        leaf = _switch(node.view.labels, leaf_key, node.view.name)
        room[leaf] += _fits(node, task)
        members[leaf].append(node.view.name)
        parent[leaf] = _switch(node.view.labels, level, node.view.name) if depth else leaf
    return room, members, parent, list(room)
