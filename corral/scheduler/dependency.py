"""Job dependencies, Slurm's vocabulary: ``after`` (every listed job started, or ended
without starting), ``afterok`` (every listed job succeeded),
``afternotok`` (every listed job ended unsuccessfully), ``afterany`` (every listed job
ended), ``singleton`` (no other job of the same user and name is running or ahead of it
in the queue). All must hold. A dependency that can no longer be met (an ``afterok`` job
failed, an unknown job) is reported, and cancels the job when it asked for that."""

from __future__ import annotations

from enum import Enum

from corral.scheduler.snapshot import Dependency, PendingJob
from corral.states import TERMINAL_JOB_STATES, JobState

SUCCESS = frozenset({JobState.SUCCEEDED.value})
ENDED = frozenset(s.value for s in TERMINAL_JOB_STATES)
KINDS = ("after", "afterok", "afternotok", "afterany", "singleton")
NOT_STARTED = frozenset({JobState.PENDING.value})


class Status(Enum):
    MET = "met"
    WAIT = "wait"
    NEVER = "never"


def status(job: PendingJob, states: dict[int, str], ahead: set[tuple[str, str]]) -> Status:
    """``states``: the state of every job named by a dependency (missing = unknown);
    ``ahead``: (user, name) of jobs running, or pending and submitted before this one."""
    result = Status.MET
    for dep in job.dependencies:
        one = _one(dep, job, states, ahead)
        if one is Status.NEVER:
            return Status.NEVER
        if one is Status.WAIT:
            result = Status.WAIT
    return result


def _one(dep: Dependency, job: PendingJob, states: dict[int, str], ahead: set[tuple[str, str]]) -> Status:
    if dep.kind == "singleton":
        return Status.WAIT if (job.user, job.name) in ahead else Status.MET
    result = Status.MET
    for job_id in dep.job_ids:
        state = states.get(job_id)
        if state is None:
            return Status.NEVER
        if dep.kind == "after":
            if state in NOT_STARTED:
                result = Status.WAIT
            continue
        if state not in ENDED:
            result = Status.WAIT
        elif dep.kind == "afterok" and state not in SUCCESS:
            return Status.NEVER
        elif dep.kind == "afternotok" and state in SUCCESS:
            return Status.NEVER
    return result


def parse(text: str) -> tuple[Dependency, ...]:
    """``afterok:12:13,afterany:14,singleton`` (Slurm's ``--dependency``; ``?`` unsupported)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, _, ids = part.partition(":")
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise ValueError(f"unknown dependency {kind!r}; use one of {', '.join(KINDS)}")
        if kind == "singleton":
            if ids:
                raise ValueError("singleton takes no job ids")
            out.append(Dependency("singleton"))
            continue
        try:
            job_ids = tuple(int(i) for i in ids.split(":") if i.strip())
        except ValueError:
            raise ValueError(f"{kind} needs job ids separated by ':', got {ids!r}") from None
        if not job_ids or any(i <= 0 for i in job_ids):
            raise ValueError(f"{kind} needs at least one positive job id (e.g. {kind}:12)")
        out.append(Dependency(kind, job_ids))
    return tuple(out)
