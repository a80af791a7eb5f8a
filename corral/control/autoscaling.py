"""Load-based autoscaling of service tasks (SkyServe's ``replica_policy`` with
``target_qps_per_replica``). Each cycle, every running task with ``autoscale`` is compared with
the request rate its endpoint measured over the last minute: it wants
``ceil(rate / target)`` replicas, within its elastic bounds. A change is made only once the
same direction has been wanted without interruption for the task's delay (``upscale_delay``
to grow, ``downscale_delay`` to shrink), so a burst shorter than that moves nothing. The
change itself is the one ``corral scale`` makes (``Scaling.reconcile``), stored, with an
``autoscaled`` event that gives the rate behind it and the bounds it stayed within.

The bounds are the user's: ``corral scale --min/--max`` moves them (a bare count on an
autoscaled task pins both to it), and the autoscaler works within whatever they are now, so a
manual scale is never undone behind the user's back.

A task that may go to zero (``num_nodes: {min: 0}``) does so once no request has come for its
downscale delay; from zero, the first request (held by the endpoint) brings replicas back at
once, without the upscale delay. A task in gangs moves by whole gangs."""

from __future__ import annotations

import math

from sqlalchemy.orm import Session

from corral.spec.models import TaskSpec

from corral.control.book import Book
from corral.control.endpoints import Endpoints
from corral.control.journal import Journal
from corral.control.scaling import Scaling
from corral.states import JobState
from corral.store import repository


class Autoscaler:
    def __init__(self, book: Book, endpoints: Endpoints, scaling: Scaling, journal: Journal):
        self.book, self.endpoints, self.scaling, self.journal = book, endpoints, scaling, journal
        # (job, task) -> (direction wanted, since when): kept in memory only, so a server
        # restart starts each delay afresh (it never scales early)
        self._wanted: dict[tuple[int, str], tuple[int, float]] = {}

    def run(self, s: Session, now: float) -> None:
        balancer = self.endpoints.balancer
        if balancer is None:
            return
        seen: set[tuple[int, str]] = set()
        for job_id in self.endpoints.jobs:
            job = self.book.active.get(job_id)
            if job is None or job.state != JobState.RUNNING or job.cancel_requested:
                continue
            for task in job.tasks:
                auto = task.service.autoscale
                if auto is None:
                    continue
                key = (job.id, task.name)
                seen.add(key)
                rate = balancer.rate(key)
                want = wanted(task.service, task.num_nodes, rate, balancer.held(key))
                if want == task.num_nodes:
                    self._wanted.pop(key, None)
                    continue
                direction = 1 if want > task.num_nodes else -1
                wanted_since = self._wanted.get(key)
                if wanted_since is None or wanted_since[0] != direction:
                    wanted_since = self._wanted[key] = (direction, now)
                delay = auto.upscale_delay if direction > 0 else auto.downscale_delay
                if task.num_nodes == 0:
                    delay = 0.0  # a request came to a service at zero: it is waiting, held, now
                if now - wanted_since[1] < delay:
                    continue
                del self._wanted[key]
                repository.set_desired_replicas(s, job.id, task.name, want)
                self.journal.event(job.id, now, task.name, "autoscaled", message=_why(
                    task.service, rate, now - wanted_since[1], task.num_nodes, want))
                self.scaling.reconcile(s, job, task.name, want, now)
        for key in set(self._wanted) - seen:  # ended jobs
            del self._wanted[key]


def wanted(spec: TaskSpec, current: int, rate: float, held: int = 0) -> int:
    """The replicas a task wants at ``rate`` requests per second: one service replica (a whole
    gang) per ``target_qps_per_replica``, within its elastic bounds; at least one while
    requests are held waiting for a replica, however long ago they came."""
    auto = spec.autoscale
    assert auto is not None
    low = current if spec.min_nodes is None else spec.min_nodes
    high = spec.max_nodes or current
    gangs = math.ceil(rate / auto.target_qps_per_replica - 1e-9)
    if held:
        gangs = max(gangs, 1)
    return min(high, max(low, gangs * spec.gang_size))


def _why(spec: TaskSpec, rate: float, waited: float, before: int, after: int) -> str:
    auto = spec.autoscale
    assert auto is not None
    moved = f"{before} -> {after} replicas"
    if spec.gang_size > 1:
        moved += f" ({after // spec.gang_size} service replica(s) of {spec.gang_size})"
    if after == 0:
        return (f"scaled to zero: no request came for its downscale_delay ({auto.downscale_delay:g}s); "
                f"{moved}, their GPUs freed; the next request to the endpoint brings one back")
    if before == 0:
        return f"a request came while at zero replicas: {moved} at once, placed by the scheduler"
    low = before if spec.min_nodes is None else spec.min_nodes
    high = spec.max_nodes or before
    alone = math.ceil(rate / auto.target_qps_per_replica - 1e-9) * spec.gang_size
    bound = f" (the rate alone wants {alone}; its min is {low})" if alone < after == low else \
        f" (the rate alone wants {alone}; its max is {high})" if alone > after == high else ""
    return (f"{rate:.2f} requests/s over the last minute at a target of {auto.target_qps_per_replica:g} per "
            f"replica, wanted for {waited:.0f}s: {moved}, within its bounds {low}..{high}{bound} "
            "(corral scale --min/--max changes them)")
