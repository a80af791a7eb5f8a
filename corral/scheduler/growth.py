"""Elastic tasks growing on their own into resources nobody else can use this cycle.

A task that says so (``num_nodes: {min: 1, max: 8, initial: 2, grow: true}``, a
``Growable`` of its ``RunningJob``) is given more replicas at the end of a cycle, once every
pending job has had its turn (admit, preempt, reserve, backfill). The rules, in order:

  1. nothing grows when a pending job could still want the resources: the pass was not a full
     one, it was cut short (``max_starts_per_cycle``, ``max_backfill_jobs``), or a job waits
     for resources (``Resources``, ``Priority``, ``Topology``) without a reservation — strict
     FIFO's head, a job past ``max_reservations``, a backfill candidate that would have
     delayed a reservation. A job held back by a limit, a dependency or a reason that no
     resource answers cannot use them, and one with a reservation is protected below;
  2. a growth replica is planned like a backfilled job that runs until the job's latest end
     (its time limit): it starts only if it delays no reservation (``fits_around``), it is
     put on the cycle's timeline and book, so nothing planned after it in the cycle can
     count on its resources, and it counts against QOS and account limits (``Tally``);
  3. it goes where the task's other replicas may go: the same partition (and nodes
     dedicated to the job), node features, node list, exclusivity, declared ports, GPU type
     and per-replica resources (``Growable.request``); each new replica takes the next rank;
  4. never above ``max_replicas``, and not before ``settled_at`` (a task just shrunk for
     someone else waits ``SETTLE_S`` before it grows again, so it does not thrash);
  5. tasks take turns one replica at a time, higher job priority first, so one task does
     not take every idle GPU while another that also grows waits.

What grows this way is lent: the replicas above the task's initial size are
``Shrinkable.lent``, the first any pending job takes back (``corral.scheduler.preemption``),
whatever its tier, highest rank first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from corral.scheduler.backfill import INFINITY, Book, Timeline, fits_around
from corral.scheduler.limits import Tally
from corral.scheduler.placement import FreePool, Scope, place_gang
from corral.scheduler.plan import Allocation, Grow, Plan, Reason
from corral.scheduler.snapshot import Growable, PendingJob, RunningJob

SETTLE_S = 60.0  # a task shrunk for someone else grows again no sooner than this

# reasons of a job that could use free resources now or soon: growth must not take them
WANTS_RESOURCES = frozenset({Reason.RESOURCES, Reason.PRIORITY, Reason.TOPOLOGY})


def blocked_by(plan: Plan, ready: list[PendingJob], cut: bool, full: bool) -> bool:
    """Rule 1: whether some pending job could still want what is free (no growth then)."""
    if cut or not full:
        return True
    started = plan.started_ids()
    return any(job.id not in started and job.id not in plan.reserved_starts
               and plan.reasons.get(job.id) in WANTS_RESOURCES for job in ready)


def request_of(job: RunningJob, part: Growable, now: float) -> PendingJob:
    """One more replica of ``part`` as a request: the job's user, account, partition and QOS,
    held until the job's latest end (what backfill and the limits plan with)."""
    left = job.latest_end - now if job.latest_end < INFINITY else None
    return PendingJob(-job.id, (replace(part.request, replicas=1),), job.started_at, job.user, job.account,
                      left, partition=job.partition, qos=job.qos, owner=job.id)


def grow(plan: Plan, running: tuple[RunningJob, ...], pool: FreePool, book: Book, timeline: Timeline, tally: Tally,
         scope_of: Callable[[PendingJob, float], Scope], now: float) -> None:
    """Add to ``plan.grows`` what the growable tasks of ``running`` take of ``pool``, each
    replica assumed in the pool, the book and the timeline as a backfilled job would be."""
    turns = [(r, part) for r in sorted(running, key=lambda r: (-r.priority, r.started_at, r.id))
             if not r.ending for part in r.growable
             if part.replicas < part.max_replicas and now >= part.settled_at]
    if not turns:
        return
    added: dict[tuple[int, str], list[Allocation]] = {}
    while turns:
        still = []
        for job, part in turns:
            key = (job.id, part.task)
            mine = added.setdefault(key, [])
            request = request_of(job, part, now)
            if part.request.distinct and mine:  # a distinct_nodes task: one replica per node
                task = request.tasks[0]
                request = replace(request, tasks=(replace(task, avoid=task.avoid | {a.node for a in mine}),))
            if tally.blocked(request) is not None or pool.free_gpus < request.gpus:
                continue
            placed = place_gang(pool, request, scope_of(request, now))
            if placed is None:
                continue
            if book and not fits_around(request, placed, now, book):
                for alloc in placed:
                    pool.release(alloc)
                continue
            rank = part.replicas + len(mine)
            ranked = tuple(replace(a, rank=rank) for a in placed)
            book.started(ranked)
            tally.start(request)
            timeline.add(job.latest_end, ranked)
            mine.extend(ranked)
            if part.replicas + len(mine) < part.max_replicas:
                still.append((job, part))
        turns = still
    sizes = {(r.id, p.task): p.replicas for r in running for p in r.growable}
    for (job_id, task), allocations in added.items():
        if allocations:
            plan.grows.append(Grow(job_id, task, sizes[(job_id, task)] + len(allocations), tuple(allocations)))
