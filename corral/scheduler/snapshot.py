"""The immutable input of one scheduling cycle: nodes with what is free on them, and the
pending jobs in queue order. Built by the control loop from the store; built by hand (or
by builders) in tests and by the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int
    cpus: float
    memory: float
    gpu_type: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    free_gpus: frozenset[int] | None = None  # None: all free
    free_cpus: float | None = None
    free_memory: float | None = None

    def __post_init__(self) -> None:
        if self.free_gpus is None:
            object.__setattr__(self, "free_gpus", frozenset(range(self.gpus)))
        if self.free_cpus is None:
            object.__setattr__(self, "free_cpus", self.cpus)
        if self.free_memory is None:
            object.__setattr__(self, "free_memory", self.memory)


@dataclass(frozen=True)
class TaskRequest:
    """Per-replica needs of one task; ``replicas`` of them go in the gang."""

    name: str
    replicas: int
    gpus: int = 0
    cpus: float = 0.1
    memory: float = 0.0
    gpu_type: str | None = None


@dataclass(frozen=True)
class PendingJob:
    id: int
    tasks: tuple[TaskRequest, ...]
    submitted_at: float = 0.0
    user: str = ""
    account: str = ""
    time_limit: float | None = None  # seconds; backfill plans with it
    nice: int = 0

    @property
    def gpus(self) -> int:
        return sum(t.replicas * t.gpus for t in self.tasks)


@dataclass(frozen=True)
class RunningJob:
    """What backfill needs of a running job: what it holds and when it will at the latest
    give it back (start + time limit)."""

    id: int
    allocations: tuple  # tuple[Allocation, ...]
    expected_end: float


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]  # submit order; policies reorder
    running: tuple[RunningJob, ...] = ()
    usage: dict[str, float] = field(default_factory=dict)  # decayed resource-seconds per account
    shares: dict[str, float] = field(default_factory=dict)  # normalised shares per account (sum 1)
    meta: dict[str, object] = field(default_factory=dict)
