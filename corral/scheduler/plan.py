"""What one scheduling cycle decides: which jobs start where, and why every other pending
job waits. A plan is data; the control loop's applier re-checks and commits it."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.states import Reason  # noqa: F401 - the scheduler's vocabulary too; defined with the states


@dataclass(frozen=True)
class Allocation:
    task: str
    rank: int
    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory: float
    # the ports the replica holds on its node's address (its task's declared ports), a node
    # resource where replicas of a node share one address (see ``NodeView.address``)
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class Start:
    job_id: int
    allocations: tuple[Allocation, ...]
    choice: tuple[int, ...] = ()  # the resource alternative each task starts with (none: as written)


@dataclass(frozen=True)
class Shrink:
    job_id: int
    task: str
    replicas: int  # the task's new size


@dataclass(frozen=True)
class Preemption:
    """Make room for ``for_job``: stop ``victims`` whole (each per its preempt mode) and
    shrink elastic tasks; the job starts in a later cycle once the resources are free."""

    for_job: int
    victims: tuple[int, ...]
    shrinks: tuple[Shrink, ...] = ()
    # (victim, why) for victims stopped as shorter work (``corral.scheduler.attained``)
    notes: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Grow:
    """Grow ``task`` of running ``job_id`` to ``replicas`` on its own, into resources no
    pending job can use this cycle: the new ranks (its highest) go on ``allocations``."""

    job_id: int
    task: str
    replicas: int  # the task's new size
    allocations: tuple[Allocation, ...]


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    reasons: dict[int, Reason] = field(default_factory=dict)
    reserved_starts: dict[int, float] = field(default_factory=dict)  # blocked job -> its planned start
    reserved_on: dict[int, tuple[Allocation, ...]] = field(default_factory=dict)  # ... and where
    preemptions: list[Preemption] = field(default_factory=list)
    grows: list[Grow] = field(default_factory=list)  # elastic tasks growing into idle resources
    cancels: dict[int, str] = field(default_factory=dict)  # job -> why (an unsatisfiable dependency)
    priorities: dict[int, object] = field(default_factory=dict)  # job -> its Factors, for sprio-like views
    # (account, user) holding less than its share of the GPUs: its starving jobs go first
    hungry: frozenset[tuple[str, str]] = frozenset()

    def started_ids(self) -> set[int]:
        return {s.job_id for s in self.starts}
