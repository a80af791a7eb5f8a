"""Service endpoints (SkyServe's ``service:``): one address per task that balances over its
READY replicas (the heads of its gangs, for multi-node service replicas). Every endpoint of
a live job listens (on the port it had, across server restarts: the port is kept in the
store) and routes to its task's ready replicas; a job's endpoints close when it ends. A task
that can scale to zero has its requests held while no replica is ready, with the reason they
are told if none comes in time. The balancer itself runs on its own threads (``balancer``)."""

from __future__ import annotations

from corral.control.balancer import Balancer
from corral.control.book import Book
from corral.control.journal import Journal
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.states import ReplicaState


class Endpoints:
    def __init__(self, book: Book, journal: Journal):
        self.book, self.journal = book, journal
        self.balancer: Balancer | None = None  # made when a job first has an endpoint
        self._jobs: set[int] = set()  # active jobs with a task that has an endpoint

    def track(self, job_id: int) -> None:
        self._jobs.add(job_id)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    @property
    def jobs(self) -> list[int]:
        """The active jobs with an endpoint, in id order."""
        return sorted(self._jobs)

    def sync(self, now: float) -> None:
        """Open, route and close endpoints to match the jobs as they are now; a port opened
        anew is journalled."""
        for job_id in sorted(self._jobs):
            job = self.book.active.get(job_id)
            if job is None:
                self._close(job_id)
                continue
            for task in job.tasks:
                endpoint = task.service.endpoint
                if endpoint is None or not self._open(job, task, endpoint.policy, now):
                    continue
                name = next((n for n, p in task.service.ports.items() if n == endpoint.port or p == endpoint.port),
                            None)
                backends = []
                members = job.replicas_of(task.name)
                spec = task.service
                for r in members:
                    port = (r.ports or {}).get(name) if name else int(endpoint.port)
                    # a replica being stopped (scale-down, cancel) takes no new connections; a
                    # gang serves on its head once every member of it runs
                    if r.state == ReplicaState.RUNNING and r.ready and r.addr and port and r.stop_requested_at is None \
                            and spec.heads(r.rank) and _gang_runs(members, spec.gang_of(r.rank), spec.gang_size):
                        backends.append((r.addr, int(port)))
                hold, why = 0.0, ""
                if spec.min_nodes == 0 and spec.autoscale is not None:  # may be at zero: requests wait for one
                    hold = endpoint.hold if endpoint.hold is not None else spec.startup_timeout
                    why = self._why_none(job, task) if not backends else ""
                self.balancer.route((job.id, task.name), backends, hold, why)  # type: ignore[union-attr]

    def _why_none(self, job: JobRec, task: TaskRec) -> str:
        """Why no replica of a task that can scale to zero is ready, in words."""
        members = [r for r in job.replicas_of(task.name) if r.stop_requested_at is None]
        if task.num_nodes == 0 or not members:
            return "the service is at zero replicas and one is being asked for"
        waiting = [r for r in members if r.state == ReplicaState.PENDING]
        if waiting:
            reason = next((self.book.growth_reasons[r.id] for r in waiting if r.id in self.book.growth_reasons),
                          None)
            if reason is None:
                return f"the service was at zero replicas; {len(waiting)} replica(s) wait for the scheduler's next pass"
            return (f"the service was at zero replicas; {len(waiting)} replica(s) wait for a place "
                    f"(reason {reason}: GPUs, quotas and fair share apply)")
        return "the service was at zero replicas; its replica is starting and not ready yet"

    def _open(self, job: JobRec, task: TaskRec, policy: str, now: float) -> bool:
        key = (job.id, task.name)
        if self.balancer is None:
            self.balancer = Balancer()
        if key in self.balancer.keys():
            return True
        try:
            port = self.balancer.open(key, task.endpoint_port or 0, policy)
        except OSError as exc:
            if not task.endpoint_port:
                self.journal.event(job.id, now, task.name, "endpoint_failed", message=f"cannot listen: {exc}")
                return False
            port = self.balancer.open(key, 0, policy)  # its old port is taken: a new one, said loudly
            self.journal.event(job.id, now, task.name, "endpoint_moved",
                               message=f"port {task.endpoint_port} is taken ({exc.strerror}); now {port}")
        if port != task.endpoint_port:
            task.endpoint_port = port
            self.journal.task(task.id, endpoint_port=port)
            self.journal.event(job.id, now, task.name, "endpoint",
                               message=f"serving {self.balancer.host}:{port}, balanced over its READY replicas")
        return True

    def _close(self, job_id: int) -> None:
        self._jobs.discard(job_id)
        if self.balancer is not None:
            for key in [k for k in self.balancer.keys() if k[0] == job_id]:
                self.balancer.close(key)

    def close(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()


def _gang_runs(members: list[ReplicaRec], gang: int, size: int) -> bool:
    """Every member of gang ``gang`` runs (a head alone serves nothing of a multi-node model)."""
    if size <= 1:
        return True
    mine = [r for r in members if r.rank // size == gang]
    return len(mine) == size and all(r.state == ReplicaState.RUNNING and r.stop_requested_at is None for r in mine)
