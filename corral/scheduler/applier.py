"""The one plan applier, shared by the control loop and the simulator: it turns a plan into
what to do now, each part re-checked against the state as it is now. Pure: no I/O, no
clock; the caller carries the actions out (the loop with signals and the store, the
simulator over its fake clock).

Contract of ``apply_plan(pool, plan, running, policy, pending=None) -> Applied``:

- ``pool`` is the free resources now. Every start is re-checked against it and its
  allocations assumed in it, a gang all or none; a start that no longer fits (resources
  taken since the snapshot, a node gone) is ``stale``, nothing of it held, for the next
  cycle to retry. Starts come first and nothing else touches the pool: an eviction or a
  shrink frees resources only once the replicas have stopped, after their grace period,
  and the caller releases them then.
- ``running`` is every running job as now (``RunningJob``: what it holds, partition, QOS,
  ``no_requeue``, ``ending`` when it is already being stopped, ``elastic`` surplus).
- A preemption for a growth request (``for_job < 0``, a replica a running job asks for)
  is refused whole: growth never preempts, it waits for free resources.
- A victim becomes an ``Eviction`` if it is still running and not already being stopped
  (nor evicted earlier in this plan); its mode is ``cancel`` when the job said no-requeue,
  else ``policy.preempt_mode(partition, qos)``; a mode of ``off`` is refused. The caller
  stops every replica with its stop signal and grace period; once all have stopped it
  requeues the job (same id, pending again, its submit time kept, restarts + 1) or
  cancels it.
- A shrink becomes a ``Downsize`` if its job is still running, not being stopped nor
  evicted in this plan, the task is still shrinkable (``RunningJob.elastic``), the new size
  is at least the task's elastic minimum and below its current size (a second shrink of
  the same task in one plan counts from the first's result). ``stopped`` names the highest
  ranks' allocations: those replicas stop, with grace; the job keeps running.
- A growth (``Plan.grows``, a task growing on its own into idle resources) becomes a
  ``Grow`` in ``grown`` if its job is still running, not being stopped nor evicted or
  shrunk in this plan, the task still grows on its own with the size the plan saw, the new
  size is at most its maximum, and every new replica's allocation still fits the pool (all
  or none; assumed in it, after the starts, so it never takes a start's place).
- A dependency cancel becomes a ``DependencyCancel`` if the job is still pending (when
  ``pending`` is given; the caller's own check otherwise).
- Everything not taken is in ``refused`` with the reason, so the caller can log it; the
  scheduler retries what still matters next cycle.

``apply_starts(pool, plan)`` is the starts part alone."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Literal

from corral.scheduler.placement import FreePool
from corral.scheduler.plan import Allocation, Grow, Plan, Start
from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import RunningJob


@dataclass(frozen=True)
class Eviction:
    """Stop ``job_id`` whole to make room for ``for_job``; then requeue or cancel it."""

    job_id: int
    mode: Literal["requeue", "cancel"]
    for_job: int
    why: str = ""  # the plan's note (preempted for shorter work: ...); empty: by tier


@dataclass(frozen=True)
class Downsize:
    """Scale ``task`` of ``job_id`` down to ``replicas``; the replicas holding ``stopped``
    (its highest ranks) stop, the job keeps running."""

    job_id: int
    task: str
    replicas: int
    for_job: int
    stopped: tuple[Allocation, ...]


@dataclass(frozen=True)
class DependencyCancel:
    job_id: int
    why: str


@dataclass(frozen=True)
class Refusal:
    """A part of the plan not carried out: ``kind`` is evict, shrink, grow or cancel."""

    job_id: int
    kind: Literal["evict", "shrink", "grow", "cancel"]
    why: str


@dataclass
class Applied:
    accepted: list[Start] = field(default_factory=list)
    stale: list[Start] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    downsizes: list[Downsize] = field(default_factory=list)
    grown: list[Grow] = field(default_factory=list)
    cancels: list[DependencyCancel] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def apply_starts(pool: FreePool, plan: Plan) -> tuple[list[Start], list[Start]]:
    """Assume every accepted start's allocations in ``pool``; returns (accepted, stale)."""
    accepted: list[Start] = []
    stale: list[Start] = []
    for start in plan.starts:
        taken = []
        try:
            for alloc in start.allocations:
                pool.assume(alloc)
                taken.append(alloc)
        except (ValueError, KeyError):  # no longer fits, or its node left the pool
            for alloc in taken:
                pool.release(alloc)
            stale.append(start)
            continue
        accepted.append(start)
    return accepted, stale


def apply_plan(pool: FreePool, plan: Plan, running: Iterable[RunningJob], policy: Policy,
               pending: Collection[int] | None = None) -> Applied:
    """The module docstring's contract."""
    out = Applied()
    out.accepted, out.stale = apply_starts(pool, plan)
    jobs = {r.id: r for r in running}
    evicted: set[int] = set()
    sizes: dict[tuple[int, str], int] = {}  # (job, task) -> its size after this plan's shrinks so far
    for preemption in plan.preemptions:
        if preemption.for_job < 0:
            out.refused += [Refusal(v, "evict", "a growth request never preempts") for v in preemption.victims]
            out.refused += [Refusal(s.job_id, "shrink", "a growth request never preempts")
                            for s in preemption.shrinks]
            continue
        for victim in preemption.victims:
            job = jobs.get(victim)
            why = None
            if job is None:
                why = "no longer running"
            elif job.ending or victim in evicted:
                why = "already being stopped"
            else:
                mode = "cancel" if job.no_requeue else policy.preempt_mode(job.partition, job.qos)
                if mode == "off":
                    why = f"preempt mode off for partition {job.partition!r}, QOS {job.qos!r}"
            if why is not None:
                out.refused.append(Refusal(victim, "evict", why))
                continue
            evicted.add(victim)
            note = dict(preemption.notes).get(victim, "")
            out.evictions.append(Eviction(victim, mode, preemption.for_job, note))  # type: ignore[arg-type]
        for shrink in preemption.shrinks:
            why, downsize = _downsize(jobs.get(shrink.job_id), shrink.task, shrink.replicas, preemption.for_job,
                                      evicted, sizes)
            if downsize is None:
                out.refused.append(Refusal(shrink.job_id, "shrink", why))
            else:
                out.downsizes.append(downsize)
    for grow in plan.grows:
        why = _grow(pool, jobs.get(grow.job_id), grow, evicted, sizes)
        if why:
            out.refused.append(Refusal(grow.job_id, "grow", why))
        else:
            out.grown.append(grow)
    for job_id, why in plan.cancels.items():
        if pending is not None and job_id not in pending:
            out.refused.append(Refusal(job_id, "cancel", "no longer pending"))
        else:
            out.cancels.append(DependencyCancel(job_id, why))
    return out


def _downsize(job: RunningJob | None, task: str, replicas: int, for_job: int, evicted: set[int],
              sizes: dict[tuple[int, str], int]) -> tuple[str, Downsize | None]:
    if job is None:
        return "no longer running", None
    if job.ending or job.id in evicted:
        return "already being stopped", None
    part = next((p for p in job.elastic if p.task == task), None)
    if part is None:
        return f"task {task!r} is not shrinkable now", None
    current = sizes.get((job.id, task), len(part.allocations))
    if replicas < part.min_replicas:
        return f"{replicas} replicas is below task {task!r}'s elastic minimum {part.min_replicas}", None
    if replicas >= current:
        return f"task {task!r} already has {current} replicas, not more than {replicas}", None
    sizes[(job.id, task)] = replicas
    return "", Downsize(job.id, task, replicas, for_job, tuple(part.allocations[replicas:current]))


def _grow(pool: FreePool, job: RunningJob | None, grow: Grow, evicted: set[int],
          sizes: dict[tuple[int, str], int]) -> str:
    """Why ``grow`` is not carried out ("" if it is: its allocations are then assumed in ``pool``)."""
    if job is None:
        return "no longer running"
    if job.ending or job.id in evicted:
        return "already being stopped"
    if (job.id, grow.task) in sizes:
        return f"task {grow.task!r} is being shrunk"
    part = next((p for p in job.growable if p.task == grow.task), None)
    if part is None:
        return f"task {grow.task!r} does not grow on its own now"
    if part.replicas + len({a.rank for a in grow.allocations}) != grow.replicas:
        return f"task {grow.task!r} has {part.replicas} replicas now, not what the plan grew from"
    if grow.replicas > part.max_replicas:
        return f"{grow.replicas} replicas is above task {grow.task!r}'s elastic maximum {part.max_replicas}"
    taken = []
    try:
        for alloc in grow.allocations:
            pool.assume(alloc)
            taken.append(alloc)
    except (ValueError, KeyError):
        for alloc in taken:
            pool.release(alloc)
        return "its resources are no longer free"
    return ""
