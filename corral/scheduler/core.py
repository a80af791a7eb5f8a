"""``schedule(snapshot, now, policy) -> Plan``: the pure scheduling function. No store, no
clock, no randomness: the same snapshot always gives the same plan.

The cycle, in numbered steps:
  1. hold     — jobs whose dependencies are not met, or that ask for more time than their
                partition allows, wait with that reason (an unsatisfiable dependency is
                reported, and cancels the job if it asked);
  2. order    — FIFO keeps submit order; ``slurm`` and ``corral`` sort by partition
                priority tier, then multifactor priority, then submit time (Slurm's order),
                with starving jobs (a site's ``starve_after``, for users short of
                their share of the GPUs) first in their tier;
  3. pool     — a what-if copy of free resources, a timeline of when running jobs give
                theirs back (start + time limit), and a tally of GPUs and GPU-minutes
                for the QOS and account limits;
  4. admit    — a job within its limits starts now if its whole gang fits (in its
                partition, under the fewest switches), or nothing of it starts;
  5. preempt  — a job that does not fit and outranks running work (partition tier, QOS)
                gets victims chosen in a what-if (``preemption``); it starts in a later
                cycle, once they are gone;
  6. reserve  — otherwise it gets a reservation (its earliest start on the timeline), up
                to the policy's number of reservations;
  7. backfill — a later job may still start now only if it delays no reservation
                (bounded: at most ``max_backfill_jobs`` jobs are examined per cycle);
  8. grow     — elastic tasks that grow on their own (``growth``) take, replica by replica,
                what no pending job can use: like backfilled jobs running to their limit.
Strict FIFO stops at the first job that does not fit (held and limit-blocked jobs aside).
``full=False`` is Slurm's main scheduler between its backfill passes: priority order, and a
partition's first job that does not fit blocks the rest of that partition (no reservations,
no backfill); the simulator's ``slurm`` model runs it on every event and a full pass every
``bf_interval``.

Policies: ``fifo``; ``slurm`` models a typical Slurm site (multifactor with age, fair-share
and a job-size factor favoring large jobs; backfill that reserves for every blocked job it
examines, bounded like bf_max_job_test; cons_tres's first-fit node choice); ``corral``
puts the smallest declared area (GPUs x time limit) first, a size factor that fades as a
job ages by at most the age weight, and bounds how long that can pass a job over: one that
waited a day x (1 - its size) goes first, oldest first, while its user holds less than
their share of the GPUs; same reservations, and fragmentation-aware best fit."""

from __future__ import annotations

import gc
import math

from corral.scheduler import attained, dependency, fairshare, growth, preemption
from corral.scheduler.backfill import INFINITY, Book, Timeline, fits_around, reserve
from corral.scheduler.guarantee import Guarantees
from corral.scheduler.limits import Tally
from corral.scheduler.placement import FreePool, Scope, gang_shortage, place_gang, port_shortage
from corral.scheduler.plan import Allocation, Plan, Reason, Start
from corral.scheduler.policy import Policy
from corral.scheduler.priority import Factors, Scorer
from corral.scheduler.snapshot import PendingJob, Snapshot

__all__ = ["Policy", "schedule", "priorities", "hungry"]


def priorities(snapshot: Snapshot, now: float, policy: Policy) -> dict[int, Factors]:
    """The multifactor priority of every pending job (``corral queue --priority``)."""
    cluster_gpus = sum(n.gpus for n in snapshot.nodes)
    shares = fairshare.factors(policy, snapshot.usage, {j.assoc for j in snapshot.pending})
    scorer = Scorer(policy, now, cluster_gpus)
    return {j.id: scorer.factors(j, shares.get(j.assoc, 0.5)) for j in snapshot.pending}


def hungry(snapshot: Snapshot, policy: Policy) -> frozenset[tuple[str, str]]:
    """The associations with pending jobs that hold fewer GPUs than their share of the
    cluster (``fairshare.entitlements`` over those with work): only their jobs may starve
    (``PriorityWeights.starve_after_s``). Empty when the site sets no starve limit."""
    if policy.weights.starve_after_s == math.inf or not snapshot.pending:
        return frozenset()
    held: dict[tuple[str, str], int] = {}
    for r in snapshot.running:
        held[r.assoc] = held.get(r.assoc, 0) + r.gpus
    waiting = {j.assoc for j in snapshot.pending}
    share = fairshare.entitlements(policy, waiting | set(held))
    total = sum(n.gpus for n in snapshot.nodes)
    return frozenset(a for a in waiting if held.get(a, 0) < share[a] * total)


def schedule(snapshot: Snapshot, now: float, policy: Policy = Policy(), full: bool = True) -> Plan:
    # A cycle allocates tens of thousands of small objects that all live until it ends: the
    # cyclic collector would walk them again and again for nothing (a large share of a cycle
    # over 50,000 pending jobs), so it waits for the cycle; nothing of it is cyclic garbage.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _cycle(snapshot, now, policy, full)
    finally:
        if paused:
            gc.enable()


def _cycle(snapshot: Snapshot, now: float, policy: Policy, full: bool) -> Plan:
    plan = Plan()
    # 1. hold
    ready: list[PendingJob] = []
    ahead = {(r.user, r.name) for r in snapshot.running if r.name}
    limited = any(p.max_time is not None for p in policy.partitions)
    # preemptors that wait and yield to no one themselves (two jobs preempted for each other
    # in turn must not each wait for the other)
    waiting = any(j.yields_to for j in snapshot.pending) and {j.id for j in snapshot.pending if not j.yields_to}
    for job in snapshot.pending:  # submit order: "ahead" grows as we go (singleton)
        held = _hold(job, snapshot, policy, ahead) if job.dependencies or limited else None
        if held is None and job.yields_to and job.yields_to in waiting:  # its preemptor goes first
            held = Reason.PRIORITY
        if job.name:
            ahead.add((job.user, job.name))
        if held is None:
            ready.append(job)
            continue
        plan.reasons[job.id] = held
        if held is Reason.DEPENDENCY_NEVER and job.kill_on_invalid_dep:
            plan.cancels[job.id] = "a dependency can never be satisfied"
    # 2. order
    starving_ids: frozenset[int] = frozenset()  # tracked under las only
    if policy.backfill:
        # Priorities the caller computed earlier are reused (Slurm recomputes them every
        # PriorityCalcPeriod, not every pass); only jobs without one are scored now.
        prio = dict(snapshot.priorities or {})
        missing = tuple(j for j in ready if j.id not in prio)
        if missing:
            prio.update(priorities(Snapshot(snapshot.nodes, missing, usage=snapshot.usage), now, policy))
        plan.priorities = prio
        plan.hungry = hungry(snapshot, policy)
        key = policy.queue_key(now, plan.hungry)
        keys = {j.id: key(j.partition, j.submitted_at, j.id, prio[j.id], j.assoc) for j in ready}
        ready.sort(key=lambda j: keys[j.id])
        if policy.las is not None:
            starving_ids = frozenset(j.id for j in ready if not keys[j.id][1])  # queue_key's second field
            attained.order_queue(ready, now, policy)
    # 3. pool
    pool = FreePool(snapshot.nodes)
    tally = Tally(snapshot, policy, now)
    timeline = Timeline()
    timeline.load((r.expected_end, r.allocations) for r in snapshot.running)
    book = Book(pool)
    # planning with predicted run times, a starving job's reservation is computed with limits
    guarantees = Guarantees(snapshot.running) if policy.learn_durations else None
    scopes = _Scopes(snapshot, policy)
    running = list(snapshot.running)
    claimed: set[int] = set()
    types: frozenset[str] | None = None  # the nodes' GPU types, once a job's reason needs them
    # replicas lent to a growing task are taken back by any pending job, preemption or not
    # (what was lent may hold no GPU at all: a CPU-only task grows into idle CPUs)
    lent = [a for r in running for p in r.elastic if p.lent for a in p.allocations[len(p.allocations) - p.lent:]]
    lent_gpus = sum(len(a.gpus) for a in lent)
    preempting = (policy.preempting or bool(lent)) and bool(running)
    # shorter-work preemption: the victims' own guards once per cycle, and a bound on the
    # blocked jobs that search (Las.max_searches, as bf_max_job_test bounds backfill)
    # (built when the first blocked job gets there: most cycles have none)
    shorter: attained.Victims | None = None
    searches = 0
    # starving jobs' reservations, (start, GPUs): no job stops shorter work to run on them
    owed_holds: list[tuple[float, frozenset[tuple[str, int]]]] = []
    freeing = 0  # GPUs of jobs already being stopped: a blocked job may wait for them
    cut = False  # the queue was not walked to its end this cycle
    examined = 0
    blocked: set[str] = set()  # partitions whose first job did not fit (a main-scheduler pass)
    arrays: dict[int, int] = {}  # array id -> its elements running (a %N throttle caps them)
    for r in snapshot.running:
        if r.array_id is not None:
            arrays[r.array_id] = arrays.get(r.array_id, 0) + 1
    for position, job in enumerate(ready):
        if job.array is not None and arrays.get(job.array[0], 0) >= job.array[1]:
            plan.reasons[job.id] = Reason.ARRAY_LIMIT
            continue
        if len(plan.starts) >= policy.max_starts_per_cycle or (book and examined >= policy.max_backfill_jobs):
            plan.reasons.update(dict.fromkeys((j.id for j in ready[position:]), Reason.PRIORITY))
            cut = True
            break
        if blocked and job.partition in blocked:
            plan.reasons[job.id] = Reason.PRIORITY
            continue
        # a job with resource alternatives is tried once per alternative (combination), in order
        variants = job.variants
        within = [(choice, v) for choice, v in variants if tally.blocked(v) is None]
        if not within:
            plan.reasons[job.id] = tally.blocked(variants[0][1])
            continue
        examined += 1
        scope = scopes.of(job, now)
        # 4. admit (and 7. backfill, once there are reservations)
        started = delayed = False
        for choice, candidate in within:
            # a count bound first: most of a long queue is examined while the pool is nearly full
            allocations = place_gang(pool, candidate, scope) if pool.free_gpus >= candidate.gpus else None
            if allocations is None:
                continue
            if not book or fits_around(candidate, allocations, now, book):
                book.started(allocations)
                tally.start(candidate)
                plan.starts.append(Start(job.id, allocations, choice if len(variants) > 1 else ()))
                if job.array is not None:
                    arrays[job.array[0]] = arrays.get(job.array[0], 0) + 1
                timeline.add(now + (job.run_s if job.run_s is not None else INFINITY), allocations)
                if guarantees is not None:
                    guarantees.started(candidate, allocations, now)
                started = True
                break
            for alloc in allocations:  # it would delay a reservation: undo the what-if
                pool.release(alloc)
            delayed = True
        if started:
            continue
        if delayed:
            plan.reasons[job.id] = Reason.PRIORITY
            continue
        first = within[0][1]
        # 5. preempt
        # (without tiers only lent GPUs can be taken back: a job they could not make fit is not tried)
        if preempting and len(plan.preemptions) < policy.max_preemptions_per_cycle and \
                (policy.preempting or first.gpus <= pool.free_gpus + lent_gpus):
            search = True
            if shorter is None and policy.las is not None:
                shorter = attained.Victims(running, policy, now)
                freeing = sum(r.gpus if r.ending else sum(len(a.gpus) for a in r.stopping) for r in running)
            if shorter is not None and not shorter.tiered and not lent:
                # only shorter work can make room: a job whose gang neither what is being
                # stopped nor every victim it could have would make room for does not search
                # (``find`` would say None), and at most max_searches jobs search per cycle
                room, could = pool.free_gpus + freeing, shorter.could(first)
                search = (freeing > 0 and first.gpus <= room) or (could > 0 and first.gpus <= room + could)
                if search:
                    search = searches < policy.las.max_searches
                    searches += 1
            chosen = preemption.find(first, pool, scope, running, policy, claimed, now, shorter) if search else None
            if chosen is not None and chosen[0].notes and owed_holds and _on_owed(first, chosen[1], owed_holds, now):
                chosen = None  # it would hold a starving job's reserved GPUs past that job's start
            if chosen is not None:
                found, placement = chosen
                # what of its place is free already is its own from now on: a later job that
                # took it would only be preempted in turn (a livelock the simulator found)
                kept = _keep_free_part(pool, placement)
                book.started(kept)
                timeline.add(now + (job.run_s if job.run_s is not None else INFINITY), kept)
                if guarantees is not None:
                    guarantees.started(job, kept, now)
                claimed.update(found.victims)
                if shorter is not None:
                    shorter.claim(found.victims)
                if found.victims or found.shrinks:
                    plan.preemptions.append(found)
                plan.reasons[job.id] = Reason.PREEMPTING
                continue
        if types is None:
            types = frozenset((n.gpu_type or "").lower() for n in snapshot.nodes)
        reasons = [_reason(snapshot, candidate, pool, scope, types) for _, candidate in within[:MAX_REASONED]]
        plan.reasons[job.id] = next((r for r in reasons if r is not Reason.GPU_TYPE), reasons[0])
        if not policy.backfill:  # strict FIFO: the first job that does not fit blocks the rest
            plan.reasons.update(dict.fromkeys((j.id for j in ready[position + 1:]), Reason.PRIORITY))
            break
        if not full:
            blocked.add(job.partition)
            continue
        # 6. reserve: the first alternative that can ever start in order; else the earliest
        if len(book) < policy.max_reservations:
            best = None
            owed = guarantees is not None and _starving(job, plan, policy, now)
            for _, candidate in within:
                reservation = guarantees.reserve(candidate, book, now, scope) if owed else \
                    reserve(candidate, book, timeline, now, scope)
                if reservation is not None and (best is None or reservation.start < best.start):
                    best = reservation
                    if job.in_order:
                        break
            if best is not None:
                if job.id in starving_ids:
                    owed_holds.append((best.start, frozenset((a.node, g) for a in best.allocations for g in a.gpus)))
                book.add(best, timeline)
                if guarantees is not None:
                    guarantees.add(best, book)
                plan.reserved_starts[job.id] = best.start
                plan.reserved_on[job.id] = best.allocations
    # 8. grow
    if policy.grow and any(r.growable for r in running) and not growth.blocked_by(plan, ready, cut, full):
        growth.grow(plan, snapshot.running, pool, book, timeline, tally, scopes.of, now)
    return plan


MAX_REASONED = 4  # alternatives looked at to say why a job waits


def _on_owed(job: PendingJob, placement: tuple[Allocation, ...], holds: list, now: float) -> bool:
    """Whether ``job``, placed on ``placement`` and run to its limit from now, would hold GPUs a
    starving job's reservation counts on after that reservation's start."""
    end = now + (job.time_limit if job.time_limit is not None else INFINITY)
    return any(end > start and any((a.node, g) in gpus for a in placement for g in a.gpus) for start, gpus in holds)


def _starving(job: PendingJob, plan: Plan, policy: Policy, now: float) -> bool:
    factors = plan.priorities.get(job.id)
    return factors is not None and policy.owed(factors, now - job.submitted_at, job.assoc in plan.hungry)


def _hold(job: PendingJob, snapshot: Snapshot, policy: Policy, ahead: set[tuple[str, str]]) -> Reason | None:
    if job.dependencies:
        status = dependency.status(job, snapshot.job_states, ahead)
        if status is dependency.Status.NEVER:
            return Reason.DEPENDENCY_NEVER
        if status is dependency.Status.WAIT:
            return Reason.DEPENDENCY
    max_time = policy.partition(job.partition).max_time
    if max_time is not None and job.time_limit is not None and job.time_limit > max_time:
        return Reason.PARTITION_TIME
    return None


def _keep_free_part(pool: FreePool, placement: tuple[Allocation, ...]) -> tuple[Allocation, ...]:
    """Take from ``pool`` the part of ``placement`` that is free now (the rest is held by
    the jobs being stopped for it); returns that part."""
    held = []
    for alloc in placement:
        node = pool.by_name[alloc.node]
        part = Allocation(alloc.task, alloc.rank, alloc.node, tuple(g for g in alloc.gpus if g in node.gpus),
                          max(0.0, min(alloc.cpus, node.cpus)), max(0.0, min(alloc.memory, node.memory)),
                          alloc.ports)
        pool.take(part)
        held.append(part)
    return tuple(held)


class _Scopes:
    """Per-partition node sets, computed once per cycle. A node dedicated to one job (the
    nodes an engine provisioned for it) is in that job's scope only."""

    def __init__(self, snapshot: Snapshot, policy: Policy):
        self.policy = policy
        self.levels = policy.topology
        self.sets: dict[str, frozenset[str] | None] = {}
        self.names = [n.name for n in snapshot.nodes]
        self.dedicated: dict[int, set[str]] = {}
        for node in snapshot.nodes:
            if node.dedicated_to is not None:
                self.dedicated.setdefault(node.dedicated_to, set()).add(node.name)
        self.reserved = frozenset(n for names in self.dedicated.values() for n in names)

    def of(self, job: PendingJob, now: float) -> Scope:
        partition = self.policy.partition(job.partition)
        if partition.name not in self.sets:
            everything = partition.nodes == ("*",) and not self.reserved
            self.sets[partition.name] = None if everything else frozenset(
                n for n in self.names if partition.holds(n) and n not in self.reserved)
        allowed = self.sets[partition.name]
        owner = job.owner or job.id  # a growth request places on its running job's nodes
        if owner in self.dedicated:
            allowed = frozenset(self.dedicated[owner])
        return Scope(allowed, self.levels, max(0.0, now - job.submitted_at), self.policy.packing == "first_fit")


def _reason(snapshot: Snapshot, job: PendingJob, pool: FreePool, scope: Scope, types: frozenset[str]) -> Reason:
    """``types``: the GPU types the snapshot's nodes carry (lower case, "" for untyped), so
    GpuTypeFilter over every node is one lookup (a walk per job cost a pass of 10,000 jobs
    asking for an absent type seconds)."""
    for task in job.tasks:
        if task.gpu_type is not None and task.gpus and task.gpu_type.lower() not in types:
            return Reason.GPU_TYPE
    if any(t.ports for t in job.tasks) and port_shortage(
            [n for n in snapshot.nodes if scope.allowed is None or n.name in scope.allowed], job):
        return Reason.CONSTRAINT  # more replicas of one port than its nodes have addresses: never, as is
    if any(t.gang > 1 for t in job.tasks) and gang_shortage(
            [n for n in snapshot.nodes if scope.allowed is None or n.name in scope.allowed], job):
        return Reason.CONSTRAINT  # fewer nodes than a gang's members, each on its own: never, as is
    if scope.levels and any(t.topology is not None and t.topology.required for t in job.tasks):
        loose = place_gang(pool, job, Scope(scope.allowed))
        if loose is not None:
            for alloc in loose:
                pool.release(alloc)
            return Reason.TOPOLOGY
    return Reason.RESOURCES
