"""Choosing what to stop so a higher-tier job can start, in a what-if pool that is always
thrown away.

Only running jobs the blocked job ``preempts`` (the strict order of ``policy``) and whose
preempt mode is not ``off`` are candidates. Work is lost as little as possible:

  1. resources of jobs already being stopped, and of replicas a shrink is stopping, count
     as free first (no new victim if they are enough: the job waits for them);
  2. replicas lent to a growing task (``Shrinkable.lent``: what it took of idle resources,
     ``corral.scheduler.growth``) are taken back first, by any pending job whatever its tier,
     highest rank first; then surplus replicas of elastic tasks the job may preempt (above
     their minimum, highest rank first), before any whole job — a shrink loses no job;
  3. then whole jobs: lowest priority first, among equals the most recently started (it
     has done the least work), then the smallest;
  4. victims are added until the gang fits, then every victim that turns out not to be
     needed is given back (latest first), so no more is stopped than the gang needs."""

from __future__ import annotations

from dataclasses import dataclass

from corral.scheduler import attained
from corral.scheduler.placement import FreePool, Scope, place_gang
from corral.scheduler.plan import Allocation, Preemption, Shrink
from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import PendingJob, RunningJob


@dataclass(frozen=True, eq=False)
class _Unit:
    job_id: int
    task: str | None  # None: the whole job
    allocations: tuple[Allocation, ...]


def candidates(job: PendingJob, running: list[RunningJob], policy: Policy, claimed: set[int],
               now: float = 0.0, shorter: attained.Victims | None = None) -> list[RunningJob]:
    """The running jobs ``job`` may stop; ``shorter``, the cycle's ``attained.Victims``, spares
    walking every running job for the shorter-work ones (the order does not matter: ``find``
    sorts them with the job id last)."""
    if shorter is not None:
        out = shorter.of(job, claimed)
        if shorter.tiered:
            seen = {r.id for r in out}
            out += [r for r in running if not r.ending and r.id not in claimed and r.id not in seen
                    and policy.preempt_mode(r.partition, r.qos) != "off"
                    and policy.preempts(job.partition, job.qos, r.partition, r.qos)]
        return out
    return [r for r in running if not r.ending and r.id not in claimed
            and (policy.preempt_mode(r.partition, r.qos) != "off"
                 and policy.preempts(job.partition, job.qos, r.partition, r.qos)
                 or attained.victim(job, r, policy, now))]


def find(job: PendingJob, pool: FreePool, scope: Scope, running: list[RunningJob], policy: Policy,
         claimed: set[int], now: float = 0.0,
         shorter: attained.Victims | None = None) -> tuple[Preemption, tuple[Allocation, ...]] | None:
    """Victims (and shrinks) that let ``job`` fit, with where it would then go;
    ``Preemption(job, ())`` if what is already being stopped is enough; None if nothing it
    may preempt would make it fit.

    Where it goes is where it was last found to fit: the what-if pool ends with exactly the
    resources it had then. Placing it afresh could miss: a what-if undone puts the nodes it
    touched last in their buckets, and greedy best fit in the new order can fail where the
    old order fit (a gang of tasks with different CPU and memory needs)."""
    trial = pool.copy()
    for r in running:
        if r.ending and r.id not in claimed:
            for alloc in r.allocations:
                trial.release(alloc)
        elif not r.ending:
            for alloc in r.stopping:
                trial.release(alloc)
    placed = _fit(trial, job, scope)
    if placed is not None:
        return Preemption(job.id, ()), placed
    victims = candidates(job, running, policy, claimed, now, shorter) if policy.preempting else []
    # (a running job's own growth request never takes back what another job was lent: the
    # applier refuses any preemption for one, and the request would hold its place for nothing)
    lenders = [] if job.id < 0 else sorted((r for r in running if not r.ending and r.id not in claimed and any(p.lent for p in r.elastic)),
                     key=lambda r: (r.priority, -r.started_at, r.id))
    if not victims and not lenders:
        return None
    units: list[_Unit] = []
    for r in lenders:  # what growth lent is given back first, by anyone
        for part in r.elastic:
            for alloc in reversed(part.allocations[len(part.allocations) - part.lent:] if part.lent else ()):
                units.append(_Unit(r.id, part.task, (alloc,)))
    by_cost = sorted(victims, key=lambda r: (attained.order(job, r, policy, now), r.priority, -r.started_at, r.gpus, r.id))
    for r in by_cost:
        for part in r.elastic:
            surplus = len(part.allocations) - part.min_replicas - part.lent
            end = len(part.allocations) - part.lent
            for alloc in reversed(part.allocations[end - surplus:end] if surplus > 0 else ()):
                units.append(_Unit(r.id, part.task, (alloc,)))
    units += [_Unit(r.id, None, tuple(a for a in r.allocations if a not in r.stopping) if r.stopping else r.allocations)
              for r in by_cost]
    # chosen units in the order taken (a dict: removing one costs nothing), and each job's
    # shrinks among them, so a long list of candidates is walked once
    chosen: dict[int, _Unit] = {}
    shrinking: dict[int, list[int]] = {}
    whole: set[int] = set()
    for at, unit in enumerate(units):
        if unit.task is not None and unit.job_id in whole:
            continue
        if unit.task is None:  # a whole job subsumes its shrinks taken so far
            for earlier in shrinking.pop(unit.job_id, ()):
                for alloc in chosen.pop(earlier).allocations:
                    trial.take(alloc)
            whole.add(unit.job_id)
        else:
            shrinking.setdefault(unit.job_id, []).append(at)
        for alloc in unit.allocations:
            trial.release(alloc)
        chosen[at] = unit
        placed = _fit(trial, job, scope)
        if placed is not None:
            break
    else:
        return None
    # Give back what is not needed, latest first; a shrink stays a block of the top ranks.
    stuck: set[tuple[int, str | None]] = set()
    for at, unit in reversed(list(chosen.items())):
        if (unit.job_id, unit.task) in stuck:
            continue
        for alloc in unit.allocations:
            trial.take(alloc)
        fit = _fit(trial, job, scope)
        if fit is not None:
            del chosen[at]
            placed = fit
        else:
            for alloc in unit.allocations:
                trial.release(alloc)
            if unit.task is not None:
                stuck.add((unit.job_id, unit.task))
    shrinks: dict[tuple[int, str], int] = {}
    sizes = {(r.id, p.task): len(p.allocations) for r in (*victims, *lenders) for p in r.elastic}
    for unit in chosen.values():
        if unit.task is not None:
            key = (unit.job_id, unit.task)
            shrinks[key] = shrinks.get(key, sizes[key]) - 1
    stopped = tuple(sorted(u.job_id for u in chosen.values() if u.task is None))
    by_id = {r.id: r for r in victims}
    notes = tuple((v, attained.why(job, by_id[v], now)) for v in stopped
                  if attained.shorter_work(job, by_id[v], policy))
    return (Preemption(job.id, stopped, tuple(Shrink(j, t, n) for (j, t), n in sorted(shrinks.items())), notes),
            placed)


def _fit(trial: FreePool, job: PendingJob, scope: Scope) -> tuple[Allocation, ...] | None:
    """Where the gang would go in ``trial`` (which is left as it was), or None."""
    allocations = place_gang(trial, job, scope)
    if allocations is not None:
        for alloc in allocations:
            trial.release(alloc)
    return allocations
