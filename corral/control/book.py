"""The control loop's memory: the jobs it manages and what each cycle has left to do.

Only the loop's thread touches a ``Book``. It is rebuilt from the store at start-up and
after a cycle whose writes were lost (``recovery``), so nothing in it is the only copy of
anything: the store holds every state, the executors every attempt.

Besides the jobs (pending, in queue order; active: STARTING, RUNNING or PREEMPTED), the
book keeps the work sets the loop's steps hand each other instead of calling each other:
jobs to evaluate (``dirty``), jobs that may have replicas to launch (``launch_check``),
jobs whose discovery files are stale (``publish``), due times (``timers``), and whether the
scheduler must run (``sched_needed``)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from corral.control.records import JobRec, ReplicaRec
from corral.scheduler import Allocation


@dataclass
class Book:
    pending: dict[int, JobRec] = field(default_factory=dict)  # queue order = id order
    active: dict[int, JobRec] = field(default_factory=dict)  # STARTING, RUNNING or PREEMPTED
    allocs: dict[int, Allocation] = field(default_factory=dict)  # replica id -> resources it holds
    by_key: dict[str, tuple[int, int]] = field(default_factory=dict)  # attempt key -> (job id, replica id)
    reasons: dict[int, str] = field(default_factory=dict)  # pending job -> why it waits, as stored
    # a waiting replica of a running job (a growth request) -> why it waits, the last pass's
    growth_reasons: dict[int, str] = field(default_factory=dict)
    ended_states: dict[int, str] = field(default_factory=dict)  # dependency targets that ended (final)
    engine_waiting: set[int] = field(default_factory=set)  # pending jobs an engine is provisioning
    unconfirmed: set[int] = field(default_factory=set)  # replicas whose engine confirms the start later
    # placed replicas whose node's engine did not answer at placement (replica id -> its words):
    # they are lost with their node instead of launched
    unanswered: dict[int, str] = field(default_factory=dict)
    # attempts on a node the site's configuration no longer declares (attempt key -> why), found
    # at recovery: ended when adopted (``departing`` once their kill is on its way), then lost
    departed: dict[str, str] = field(default_factory=dict)
    departing: dict[str, str] = field(default_factory=dict)
    cancels_seen: set[int] = field(default_factory=set)
    timers: list[tuple[float, int]] = field(default_factory=list)  # (due, job id), a heap
    dirty: set[int] = field(default_factory=set)  # jobs to evaluate this cycle
    launch_check: set[int] = field(default_factory=set)  # jobs that may have replicas to launch
    publish: set[int] = field(default_factory=set)  # jobs whose discovery files are stale
    sched_needed: bool = True  # something the scheduler reads changed

    def reset(self) -> None:
        """Forget everything (its contents are rebuilt from the store)."""
        self.__init__()  # type: ignore[misc]

    def job(self, job_id: int | None) -> JobRec | None:
        return self.active.get(job_id) if job_id is not None else None

    def replica_of(self, key: str) -> tuple[JobRec | None, ReplicaRec | None]:
        """The job and replica whose *current* attempt has this key (None, None if nobody's)."""
        job_id, replica_id = self.by_key.get(key, (None, None))
        job = self.job(job_id)
        replica = next((r for r in job.replicas if r.id == replica_id), None) if job is not None else None
        if replica is None or replica.launch_key != key:
            return None, None
        return job, replica

    def wake_at(self, at: float, job_id: int) -> None:
        heapq.heappush(self.timers, (at, job_id))

    def due(self, now: float) -> None:
        """Every job whose timer is due is evaluated this cycle."""
        while self.timers and self.timers[0][0] <= now:
            self.dirty.add(heapq.heappop(self.timers)[1])

    def next_due(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    def free(self, replica_id: int) -> None:
        """A replica ended: what it held is free (the scheduler looks again)."""
        if self.allocs.pop(replica_id, None) is not None:
            self.sched_needed = True

    def touch(self, job_id: int) -> None:
        """Something happened to the job: evaluate it, rewrite its files, launch what may start."""
        self.dirty.add(job_id)
        self.publish.add(job_id)
