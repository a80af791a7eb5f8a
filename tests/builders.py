"""Builders for the pure core's inputs, so tests say only what matters to them."""

from __future__ import annotations

import math
from dataclasses import replace

from corral.control.lifecycle import JobView, ReplicaView, TaskView
from corral.scheduler import NodeView, PendingJob, Policy, Snapshot, TaskRequest
from corral.states import JobState, ReplicaState

# corral with its job size in GPUs weighted no more than age and no starve limit (its default
# until session 9): the weights under which the size fade alone bounds how long a job waits,
# and under which two jobs that differ only in time limit rank alike
CORRAL_BY_GPUS = Policy.named("corral", weights=replace(Policy.named("corral").weights, job_size=1000.0, size_by="gpus",
                                                        starve_after_s=math.inf))


def node(name: str = "n0", gpus: int = 8, cpus: float = 32, memory: float = 256, gpu_type: str | None = "H100",
         free_gpus: set[int] | None = None, free_cpus: float | None = None) -> NodeView:
    return NodeView(name, gpus, cpus, memory, gpu_type, free_gpus=None if free_gpus is None else frozenset(free_gpus),
                    free_cpus=free_cpus)


def task(name: str = "main", replicas: int = 1, gpus: int = 0, cpus: float = 0.1, memory: float = 0.0,
         gpu_type: str | None = None) -> TaskRequest:
    return TaskRequest(name, replicas, gpus, cpus, memory, gpu_type)


def job(job_id: int, *tasks: TaskRequest, submitted_at: float = 0.0) -> PendingJob:
    return PendingJob(job_id, tasks or (task(),), submitted_at)


def snapshot(nodes: list[NodeView], jobs: list[PendingJob]) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(jobs))


class GroupBuilder:
    """A job view for lifecycle tests: add tasks, set replica states, evaluate."""

    def __init__(self, job_id: int = 1, state: JobState = JobState.RUNNING):
        self.job_id, self.state, self.cancel = job_id, state, False
        self.ended_by = None  # (state, words) when the engine that provisioned its nodes ended them
        self.tasks: list[TaskView] = []
        self.replicas: list[ReplicaView] = []

    def task(self, name: str, primary: bool = True, replicas: int = 1, delay: float = 0.0,
             deadline: float | None = None, holds_nodes: bool = False) -> GroupBuilder:
        self.tasks.append(TaskView(name, primary, delay, deadline, holds_nodes))
        for rank in range(replicas):
            self.replicas.append(ReplicaView(len(self.replicas) + 1, name, rank, ReplicaState.RUNNING, None, False))
        return self

    def replica(self, label: str, state: ReplicaState, exit_code: int | None = None,
                stopping: bool = False) -> GroupBuilder:
        name, rank = label.rsplit("-", 1)
        self.replicas = [ReplicaView(r.id, r.task, r.rank, state, exit_code, stopping)
                         if (r.task, r.rank) == (name, int(rank)) else r for r in self.replicas]
        return self

    def build(self) -> JobView:
        return JobView(self.job_id, self.state, self.cancel, tuple(self.tasks), tuple(self.replicas), self.ended_by)

    def id_of(self, label: str) -> int:
        name, rank = label.rsplit("-", 1)
        return next(r.id for r in self.replicas if (r.task, r.rank) == (name, int(rank)))
