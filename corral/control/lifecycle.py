"""Job-group lifecycle as pure decisions: given a job's tasks and replicas and the time,
say which replicas to stop, which termination deadlines to set and whether the job ends.
No I/O here: it returns decisions (``corral.control.decisions``: ``Stop``, ``SetDeadline``,
``EndJob``, ``WakeAt``) that the loop's carrier carries out, recording each with its cause.

Rules (SkyPilot job-group semantics, with the delay persisted):
  * primaries drive completion; a plain job's one task is its own primary;
  * every primary replica succeeded → each auxiliary stops after its termination delay,
    then the job SUCCEEDS (or FAILS if an auxiliary had failed on its own);
  * a primary replica failed → every other replica stops at once, the job FAILS;
  * an auxiliary failing on its own does not stop the primaries, but the job ends FAILED;
  * cancel → every replica stops with its grace period, the job is CANCELLED;
  * the engine that provisioned the job's nodes ended them (a Slurm time limit, an scancel
    from outside) → every replica stops, the job ends as the engine said (TIMEOUT, CANCELLED
    or FAILED), with the engine's words;
  * a replica reaching its task's time limit → every replica stops, the job ends TIMEOUT;
  * a batch script's job loses a node (a replica holding one of its nodes ends without being
    asked, while the script runs) → every replica stops and the job FAILS, as Slurm ends a job
    whose node fails: the script's steps on that node ran in the script's own tree, so they
    must not outlive the GPUs the holder gave back."""

from __future__ import annotations

from dataclasses import dataclass

from corral.control.decisions import Decision, EndJob, SetDeadline, Stop, WakeAt
from corral.states import JobState, ReplicaState


@dataclass(frozen=True)
class TaskView:
    name: str
    primary: bool
    termination_delay: float
    termination_deadline: float | None
    holds_nodes: bool = False  # a batch script's node holders (the script's steps run on their nodes)


@dataclass(frozen=True)
class ReplicaView:
    id: int
    task: str
    rank: int
    state: ReplicaState
    exit_code: int | None
    stopping: bool  # corral already asked it to stop
    timed_out: bool = False  # stopped because its task's time limit ran out
    cause: str = ""  # why it ended, as recorded: "exited", "lost", "dependency_failed" …
    why: str = ""  # the words of its end: "exit code 1", "lost: its node is down" …


@dataclass(frozen=True)
class JobView:
    id: int
    state: JobState
    cancel_requested: bool
    tasks: tuple[TaskView, ...]
    replicas: tuple[ReplicaView, ...]
    # the engine that provisioned its nodes ended them: (the job's end state, the engine's words)
    ended_by: tuple[JobState, str] | None = None


def evaluate(job: JobView, now: float) -> list[Decision]:
    out: list[Decision] = []
    if job.state.terminal or job.state == JobState.PENDING:
        return out
    live = [r for r in job.replicas if not r.state.terminal]
    primary_tasks = {t.name for t in job.tasks if t.primary}

    if job.ended_by is not None:  # its nodes are gone (or going): it ends as the engine ended them
        state, words = job.ended_by
        _stop(out, live, "allocation_ended")
        if not live:
            out.append(EndJob(state, None, "allocation_ended", words))
        return out

    if job.cancel_requested:
        _stop(out, live, "cancel")
        if not live:
            out.append(EndJob(JobState.CANCELLED, None, "cancel", "cancelled by request"))
        return out

    timed_out = next((r for r in job.replicas if r.timed_out), None)
    if timed_out is not None:  # like Slurm: a time limit ends the whole job
        _stop(out, live, "job_time_limit")
        if not live:
            out.append(EndJob(JobState.TIMEOUT, timed_out.exit_code, "time_limit",
                              f"replica {timed_out.task}-{timed_out.rank} reached its time limit"))
        return out

    failed = [r for r in job.replicas if r.task in primary_tasks and r.state == ReplicaState.FAILED]
    # the primary that failed on its own, before one that never started because another failed
    failed_primary = next((r for r in failed if r.cause not in CONSEQUENCES), failed[0] if failed else None)
    if failed_primary is not None:
        _stop(out, live, "primary_failed")
        if not live:
            out.append(EndJob(JobState.FAILED, failed_primary.exit_code, "primary_failed",
                              _blame(job, failed_primary, "primary")))
        return out

    holders = {t.name for t in job.tasks if t.holds_nodes}
    lost = next((r for r in job.replicas if r.task in holders
                 and r.state in (ReplicaState.FAILED, ReplicaState.SUCCEEDED)), None)  # ended unasked
    if lost is not None and job.state in (JobState.RUNNING, JobState.STARTING) \
            and not any(r.task in primary_tasks and r.state == ReplicaState.SUCCEEDED for r in job.replicas):
        _stop(out, live, "node_lost")
        if not live:
            out.append(EndJob(JobState.FAILED, lost.exit_code, "node_lost",
                              f"replica {lost.task}-{lost.rank}, which held one of the batch job's nodes, ended "
                              f"({_how(lost)}): the job ends, as Slurm ends a job that loses a node"))
        return out

    primaries = [r for r in job.replicas if r.task in primary_tasks]
    if primaries and all(r.state == ReplicaState.SUCCEEDED for r in primaries):
        wake_at = None
        for task in job.tasks:
            if task.primary:
                continue
            task_live = [r for r in live if r.task == task.name]
            if not task_live:
                continue
            deadline = task.termination_deadline
            if deadline is None:
                deadline = now + task.termination_delay
                out.append(SetDeadline(task.name, deadline))
            if now >= deadline:
                _stop(out, task_live, "termination_delay")
            else:
                wake_at = deadline if wake_at is None else min(wake_at, deadline)
        if wake_at is not None:
            out.append(WakeAt(wake_at))
        if not live:
            failed_aux = next((r for r in job.replicas if r.state == ReplicaState.FAILED), None)
            if failed_aux is not None:
                out.append(EndJob(JobState.FAILED, failed_aux.exit_code, "auxiliary_failed",
                                  _blame(job, failed_aux, "auxiliary")))
            else:
                out.append(EndJob(JobState.SUCCEEDED, 0, "primaries_succeeded"))
        return out

    if not live and job.replicas and job.state in (JobState.RUNNING, JobState.STARTING):
        # nothing runs and no rule above ended it (a gang stopped after a member exited 0 without
        # restarting, a replica stopped by a probe): a job with nothing left never stays RUNNING
        first = next((r for r in job.replicas if r.state != ReplicaState.SUCCEEDED), None)
        if first is None:
            out.append(EndJob(JobState.SUCCEEDED, 0, "nothing_left", "every replica succeeded"))
            return out
        out.append(EndJob(JobState.FAILED, first.exit_code, "nothing_left",
                          f"no replica is left and its primaries did not all succeed: replica "
                          f"{first.task}-{first.rank} ended {first.state.value} ({_how(first)})"))
    return out


# Ends that are the consequence of another replica's failure, not a failure of their own.
CONSEQUENCES = frozenset({"dependency_failed"})


def _how(replica: ReplicaView) -> str:
    if replica.why:
        return replica.why
    # A replica lost with its node, or killed before it reported, has no exit code to show.
    return f"exit code {replica.exit_code}" if replica.exit_code is not None else "no exit code: it was lost or killed"


def _blame(job: JobView, replica: ReplicaView, kind: str) -> str:
    """The replica that failed and why; when its end was another's doing (it never started
    because a task it waits for failed), the replica that failed on its own, and why."""
    text = f"{kind} replica {replica.task}-{replica.rank} failed ({_how(replica)})"
    if replica.cause in CONSEQUENCES:
        first = next((r for r in job.replicas if r.state == ReplicaState.FAILED and r.cause not in CONSEQUENCES
                      and not r.stopping), None)
        if first is not None:
            text += f"; replica {first.task}-{first.rank} failed first ({_how(first)})"
    return text


def _stop(out: list[Decision], replicas: list[ReplicaView], cause: str) -> None:
    out.extend(Stop(r.id, cause) for r in replicas if not r.stopping)
