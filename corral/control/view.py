"""What the control loop shows the rest of the server, which never reads the loop's memory:

* ``LoopView`` — an immutable picture published after every cycle (a reference swap, read
  by API threads and admission without a lock): the node pool, DOWN nodes, the infras that
  do not answer and the partitions DOWN with them, expected starts, pending jobs' predicted run
  times, the loop's health.
* ``Reads`` — answers computed on the loop's own thread when asked (``ControlLoop.ask``),
  for what is too large to copy every cycle and read rarely (the ranked queue, what every
  replica holds, fair share, the logs being written): each a plain, immutable result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from corral.control.accounting import Holding
from corral.control.book import Book
from corral.control.scheduling import Scheduling
from corral.pool import NodeSpec
from corral.scheduler import NodeView, Policy, fairshare
from corral.scheduler.priority import Factors
from corral.settings import Settings
from corral.states import ReplicaState

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class LoopView:
    cycles: int = 0
    failing_cycles: int = 0  # in a row; /v1/health reports a loop that keeps failing
    last_error: str | None = None
    nodes: tuple[NodeSpec, ...] = ()
    node_infra: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    down: tuple[tuple[NodeSpec, str], ...] = ()  # (node, the infra it was on)
    expected_starts: Mapping[int, float] = field(default_factory=lambda: _EMPTY)  # pending job -> planned start
    unreachable: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # infra -> why its engine does not answer
    down_partitions: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # partition -> why it is DOWN
    predictions: Mapping[int, float] = field(default_factory=lambda: _EMPTY)  # pending job -> predicted run time (s)
    # a running job's replica waiting for a place (grown, or placed again) -> the scheduler's reason
    waiting: Mapping[int, str] = field(default_factory=lambda: _EMPTY)
    # the last CHANGES_KEPT publications: (cycle, the jobs whose row or events it wrote), oldest first
    changes: tuple[tuple[int, frozenset[int]], ...] = ()


CHANGES_KEPT = 256  # publications a long poll's watcher may fall behind by before it wakes every waiter


@dataclass(frozen=True)
class Ranked:
    """A pending job as the last scheduling pass ranked it."""

    id: int
    name: str
    user: str
    account: str
    partition: str
    qos: str
    nice: int
    factors: Factors | None
    reason: str
    starving: bool


@dataclass(frozen=True)
class Held:
    """What one replica holds now."""

    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory: float
    job: int
    job_name: str
    user: str
    account: str
    replica: str
    state: str
    partition: str = ""


class Reads:
    """Answers computed on the loop's thread (``ControlLoop.ask``)."""

    def __init__(self, book: Book, scheduling: Scheduling, policy: Policy, settings: Settings):
        self.book, self.scheduling, self.policy, self.settings = book, scheduling, policy, settings

    def free_nodes(self) -> tuple[NodeView, ...]:
        return self.scheduling.free_views()

    def ranked(self, now: float) -> list[Ranked]:
        return [Ranked(j.id, j.name, j.user, j.account, j.partition, j.qos, j.nice, f, reason, starving)
                for j, f, reason, starving in self.scheduling.ranked(now)]

    def held(self) -> list[Held]:
        return [Held(alloc.node, tuple(alloc.gpus), alloc.cpus, alloc.memory, job.id, job.name, job.user,
                     job.account or job.user, replica.label, replica.state.value, job.partition)
                for job, replica, alloc in self.scheduling.allocations()]

    def holdings(self) -> list[Holding]:
        return self.scheduling.holdings()

    def share(self) -> list:
        """The fair-share tree's rows for every account and user with a job in the loop."""
        jobs = list(self.book.pending.values()) + list(self.book.active.values())
        assocs = {(j.account or j.user, j.user) for j in jobs}
        return fairshare.report(self.policy, self.scheduling.ledger.usage(), assocs)

    def live_logs(self) -> list[str]:
        """Logs replicas are writing now (the housekeeper never rotates them away)."""
        return [str(self.settings.log_file(job.id, r.label)) for job in self.book.active.values()
                for r in job.replicas if r.state == ReplicaState.RUNNING]
