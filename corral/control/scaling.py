"""Elastic replica counts: a task grows with new (or revived) ranks that the scheduler
places like any job, so every limit holds at every instant, or shrinks by stopping its
highest ranks with the task's stop signal and grace period. A replica of a running job that
waits for a place (a task that grew, or a replica whose node went away) is a one-replica
request in the scheduler's plan, with its replica's id negated as its job id. A task whose
replicas come in gangs (a multi-node service replica) grows and shrinks by whole gangs, and
a gang's waiting members are one all-or-none request, on nodes distinct from one another and
from those its running members hold."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.placement import Placer
from corral.control.records import JobRec, ReplicaRec
from corral.control.transitions import Transitions
from corral.scheduler import Allocation, Growable, PendingJob, TaskRequest
from corral.scheduler.growth import SETTLE_S
from corral.states import JobState, ReplicaState
from corral.store import repository


class Scaling:
    def __init__(self, book: Book, moves: Transitions, carrier: Carrier, placer: Placer):
        self.book, self.moves, self.carrier, self.placer = book, moves, carrier, placer
        # (job, task) -> when it was last shrunk for another job: a task that grows on its own
        # waits growth.SETTLE_S after it (in memory: a restart forgets it, one early regrowth)
        self.shrunk_at: dict[tuple[int, str], float] = {}

    def grow(self, s: Session, job_id: int, task_name: str, count: int, allocs: tuple[Allocation, ...],
             now: float) -> None:
        """A task growing on its own into idle GPUs (``num_nodes: {..., grow: true}``): its new
        ranks are added as ``corral scale`` adds them, journalled, and bound at once to where
        the plan put them (the applier re-checked that they are free)."""
        job = self.book.active.get(job_id)
        if job is None or job.state not in (JobState.RUNNING, JobState.STARTING):
            return
        task = job.task(task_name)
        before = len(job.replicas_of(task_name))
        self.moves.event(job.id, now, task_name, "grew",
                         f"{before} -> {count} replicas: grew into idle "
                         f"{'GPUs' if any(a.gpus for a in allocs) else 'resources (CPUs, memory)'} "
                         f"(elastic max {task.service.max_nodes}; "
                         f"replicas above {max(int(task.spec.get('num_nodes') or 1), task.service.min_nodes or 0)} "
                         f"are given back first when a pending job needs them)")
        self.moves.journal.task(task.id, num_nodes=count)
        self.reconcile(s, job, task_name, count, now)
        where = {a.rank: a for a in allocs}
        for replica in job.replicas_of(task_name):
            alloc = where.get(replica.rank)
            if alloc is not None and replica.state == ReplicaState.PENDING:
                self.placer.place(job, replica, Allocation(task_name, replica.rank, alloc.node, alloc.gpus, alloc.cpus,
                                                           alloc.memory, alloc.ports), now)
        self.book.launch_check.add(job.id)

    def growable(self, job: JobRec, task, members: list[ReplicaRec], now: float) -> Growable | None:  # noqa: ANN001
        """The task as one that grows on its own now, or None: it asks to (``grow``), is below
        its max, and every member is placed and not stopping (the count the plan grows from)."""
        spec = task.service
        if not spec.grow or job.state != JobState.RUNNING or spec.max_nodes is None:
            return None
        if len(members) >= spec.max_nodes or len(members) != len(job.replicas_of(task.name)):
            return None
        ports = tuple(sorted(set(spec.ports.values())))
        request = TaskRequest(task.name, 1, task.gpus, task.cpus, task.memory, task.gpu_type,
                              constraint=spec.constraint, nodes=frozenset(spec.nodelist) if spec.nodelist else None,
                              exclusive=spec.exclusive, ports=ports, distinct=spec.distinct_nodes,
                              avoid=_apart(job, task.name, []) if spec.distinct_nodes else frozenset())
        shrunk = self.shrunk_at.get((job.id, task.name))
        return Growable(task.name, len(members), spec.max_nodes, request,
                        0.0 if shrunk is None else shrunk + SETTLE_S)

    def reconcile(self, s: Session, job: JobRec, task_name: str, count: int, now: float) -> None:
        """Grow a task with new (or revived) ranks for the scheduler to place, or shrink it by
        stopping its highest ranks with the task's stop signal and grace period."""
        task = job.task(task_name)
        gang = task.service.gang_size
        if count % gang:  # a shrink to make room takes whole gangs (a half gang serves nothing)
            count -= count % gang
            self.moves.journal.task(task.id, num_nodes=count)
        task.num_nodes = count
        members = sorted(job.replicas_of(task_name), key=lambda r: r.rank)
        if count > len(members):
            self.book.sched_needed = True  # the new ranks are placed by the scheduler
            retired = {r.rank: r for r in job.replicas if r.task == task_name and r.retired}
            ranks = list(range(len(members), count))
            fresh = [rank for rank in ranks if rank not in retired]
            position = job.tasks.index(task)
            for rank, replica_id in zip(fresh, repository.add_replicas(s, job.id, task_name, position, fresh)):
                job.replicas.append(ReplicaRec(replica_id, job.id, task_name, rank, ReplicaState.PENDING))
                self.moves.journal.event(job.id, now, f"{task_name}-{rank}", "scale_up", None,
                                         ReplicaState.PENDING.value)
            for rank in ranks:
                if rank in retired:
                    r = retired[rank]
                    r.stop_requested_at = r.stop_cause = r.exit_code = r.kill_at = r.handle = r.node = None
                    r.ready, r.gpus = False, ()
                    self.moves.replica_to(r, ReplicaState.PENDING, "scale_up", now, stop_requested_at=None,
                                          stop_cause=None, exit_code=None, kill_at=None, handle=None, node=None,
                                          gpus=[], ended_at=None, ready=False)
            job.replicas.sort(key=lambda r: ([t.name for t in job.tasks].index(r.task), r.rank))
        else:
            for replica in members[count:]:
                if replica.stop_requested_at is not None and not replica.state.terminal:
                    continue  # already on its way out
                if replica.state.terminal:  # already ended: just leaves the membership
                    replica.stop_cause = "scale_down"
                    self.moves.journal.replica(replica.id, stop_cause="scale_down")
                else:
                    self.carrier.stop(job, replica, "scale_down", now)
        self.moves.event(job.id, now, task_name, "scaled", f"{len(members)} -> {count} replicas")
        self.book.touch(job.id)

    def requests(self, now: float) -> list[PendingJob]:
        """Replicas of running jobs waiting for a place, each as a request the scheduler ranks
        and places like any job, so QOS and account limits, partitions and priorities hold at
        every instant: one replica alone, or the waiting members of one gang (a multi-node
        service replica) together, all or none, under the id of the first of them."""
        out = []
        for job in self.book.active.values():
            if job.state not in (JobState.RUNNING, JobState.STARTING) or job.cancel_requested:
                continue
            now_placed = {t.name for t in job.stage()}  # a pipeline's later stages wait their turn
            for task_name, members in _waiting(job, now_placed):
                task = job.task(task_name)
                spec = task.service
                limit = job.time_limit_of(task)
                if limit is not None and job.started_at is not None:
                    limit = max(1.0, limit - (now - job.started_at))
                ports = tuple(sorted(set(spec.ports.values())))
                # where its nodes may go, as when the job started: a replica placed again (its
                # node lost, a scale up) keeps to the task's features, node list and exclusivity
                request = TaskRequest(task.name, len(members), task.gpus, task.cpus, task.memory, task.gpu_type,
                                      constraint=spec.constraint,
                                      nodes=frozenset(spec.nodelist) if spec.nodelist else None,
                                      exclusive=spec.exclusive, ports=ports, avoid=_apart(job, task_name, members))
                if len(members) > 1 or spec.gang_size > 1:  # a gang: its members apart as the task says
                    request = replace(request, distinct=spec.distinct_nodes, gang=spec.gang_size)
                out.append(PendingJob(-members[0].id, (request,), job.submitted_at, job.user, job.account, limit,
                                      job.nice, job.partition, job.qos, job.priority, (), job.name, owner=job.id))
        return out

    def spread(self, reasons: dict[int, str]) -> dict[int, str]:
        """Why requests of ``requests`` wait (keyed by their first replica's id), for every
        replica of each request: a waiting gang's members all wait for the same reason."""
        if not reasons:
            return {}
        out = dict(reasons)
        for job in self.book.active.values():
            for _, members in _waiting(job, {t.name for t in job.tasks}):
                reason = reasons.get(members[0].id)
                if reason is not None:
                    out.update((m.id, reason) for m in members)
        return out

    def place(self, replica_id: int, allocs: tuple[Allocation, ...], now: float) -> None:
        """Bind what the scheduler placed for a request of ``requests``: the replica of that id
        and, for a gang, its other waiting members, in rank order."""
        for job in self.book.active.values():
            replica = next((r for r in job.replicas if r.id == replica_id), None)
            if replica is None:
                continue
            group = next((m for _, m in _waiting(job, {replica.task}) if m[0].id == replica_id), [])
            for member, alloc in zip(group, sorted(allocs, key=lambda a: a.rank)):
                self.placer.place(job, member, Allocation(member.task, member.rank, alloc.node, alloc.gpus,
                                                          alloc.cpus, alloc.memory, alloc.ports), now)
            if group:
                self.book.launch_check.add(job.id)
            return


def _apart(job: JobRec, task_name: str, members: list[ReplicaRec]) -> frozenset[str]:
    """The nodes waiting ``members`` may not go to: those their gang's running members hold
    (a gang's members on distinct nodes), and for a ``distinct_nodes`` task those of every
    live replica of the job's distinct tasks."""
    spec = job.task(task_name).service
    gangs = {spec.gang_of(m.rank) for m in members} if spec.gang_size > 1 else set()
    distinct = {t.name for t in job.tasks if t.service.distinct_nodes} if spec.distinct_nodes else set()
    return frozenset(r.node for r in job.replicas
                     if r.node is not None and not r.state.terminal and r.state != ReplicaState.PENDING
                     and (r.task in distinct or r.task == task_name and r.rank in _ranks_of(spec, gangs)))


def _ranks_of(spec, gangs: set[int]) -> set[int]:  # noqa: ANN001 - a TaskSpec
    return {g * spec.gang_size + i for g in gangs for i in range(spec.gang_size)}


def _waiting(job: JobRec, tasks: set[str]) -> list[tuple[str, list[ReplicaRec]]]:
    """A running job's replicas waiting for a place, in the groups the scheduler places at
    once: each alone, or a gang's waiting members together (in rank order)."""
    groups: dict[tuple[str, int], list[ReplicaRec]] = {}
    for r in sorted(job.replicas, key=lambda r: (r.task, r.rank)):
        if r.state != ReplicaState.PENDING or r.task not in tasks:
            continue
        spec = job.task(r.task).service
        key = (r.task, spec.gang_of(r.rank) if spec.gang_size > 1 else r.rank)
        groups.setdefault(key, []).append(r)
    return [(task, members) for (task, _), members in groups.items()]
