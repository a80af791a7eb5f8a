"""Load-based autoscaling of service tasks (SkyServe's ``replica_policy`` with
``target_qps_per_replica``). Each cycle, every running task with ``autoscale`` is compared with
the request rate its endpoint measured over the last minute: it wants
``ceil(rate / target)`` replicas, within its elastic bounds. A change is made only once the
same direction has been wanted without interruption for the task's delay (``upscale_delay``
to grow, ``downscale_delay`` to shrink), so a burst shorter than that moves nothing. The
change itself is the one ``corral scale`` makes (``Scaling.reconcile``), stored, with an
``autoscaled`` event that gives the rate behind it."""

from __future__ import annotations

import math

from sqlalchemy.orm import Session

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
                low = task.service.min_nodes or task.num_nodes
                high = task.service.max_nodes or task.num_nodes
                want = min(high, max(low, math.ceil(rate / auto.target_qps_per_replica - 1e-9)))
                if want == task.num_nodes:
                    self._wanted.pop(key, None)
                    continue
                direction = 1 if want > task.num_nodes else -1
                wanted = self._wanted.get(key)
                if wanted is None or wanted[0] != direction:
                    self._wanted[key] = (direction, now)
                    continue
                delay = auto.upscale_delay if direction > 0 else auto.downscale_delay
                if now - wanted[1] < delay:
                    continue
                del self._wanted[key]
                repository.set_desired_replicas(s, job.id, task.name, want)
                self.journal.event(job.id, now, task.name, "autoscaled", message=(
                    f"{rate:.2f} requests/s over the last minute at a target of {auto.target_qps_per_replica:g} per "
                    f"replica, wanted for {now - wanted[1]:.0f}s: {task.num_nodes} -> {want} replicas"))
                self.scaling.reconcile(s, job, task.name, want, now)
        for key in set(self._wanted) - seen:  # ended jobs
            del self._wanted[key]
