"""What one scheduling cycle decides: which jobs start where, and why every other pending
job waits. A plan is data; the control loop's applier re-checks and commits it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Reason(str, Enum):
    """Why a pending job waits, in Slurm's REASON vocabulary."""

    NONE = "None"
    PRIORITY = "Priority"  # a job ahead of it in the queue waits first
    RESOURCES = "Resources"  # free resources are not enough for the whole gang now
    GPU_TYPE = "ReqGPUTypeNotAvail"  # no node offers the GPU type asked for


@dataclass(frozen=True)
class Allocation:
    task: str
    rank: int
    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory: float


@dataclass(frozen=True)
class Start:
    job_id: int
    allocations: tuple[Allocation, ...]


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    reasons: dict[int, Reason] = field(default_factory=dict)
    reserved_starts: dict[int, float] = field(default_factory=dict)  # blocked job -> its planned start

    def started_ids(self) -> set[int]:
        return {s.job_id for s in self.starts}
