"""Start ordering inside a job group (``depends_on``), as pure functions over job records.

A job's whole gang is placed at once (its resources are held), but a task whose
dependencies are not met yet stays STARTING without a process. Conditions, over every
replica of the task depended on:
  * ``started``   — each is RUNNING (or already SUCCEEDED);
  * ``ready``     — each is RUNNING and ready (readiness probe passed, or none declared),
                    or already SUCCEEDED;
  * ``succeeded`` — each SUCCEEDED.
Ordering gates only a replica's first launch: a dependency that later restarts does not
stop what already runs (its peers see it come back through the same name)."""

from __future__ import annotations

from corral.control.records import JobRec, ReplicaRec
from corral.states import ReplicaState


def condition_met(replicas: list[ReplicaRec], condition: str) -> bool:
    if not replicas:
        return False
    if condition == "succeeded":
        return all(r.state == ReplicaState.SUCCEEDED for r in replicas)
    if condition == "started":
        return all(r.state in (ReplicaState.RUNNING, ReplicaState.SUCCEEDED) for r in replicas)
    return all(r.state == ReplicaState.SUCCEEDED or (r.state == ReplicaState.RUNNING and r.ready) for r in replicas)


def condition_impossible(replicas: list[ReplicaRec]) -> bool:
    """True once no condition can hold any more: a replica ended failed or killed (a
    replica waiting to restart may still get there)."""
    return any(r.state in (ReplicaState.FAILED, ReplicaState.KILLED) for r in replicas)


def waiting(job: JobRec) -> list[ReplicaRec]:
    """Replicas placed (or due to restart) with no process yet."""
    return [r for r in job.replicas if r.state == ReplicaState.STARTING and r.handle is None]


def launchable(job: JobRec) -> list[ReplicaRec]:
    out = []
    for replica in waiting(job):
        deps = job.task(replica.task).service.depends_on
        if replica.restarts > 0 or all(condition_met(job.replicas_of(d.task), d.condition) for d in deps):
            out.append(replica)
    return out


def blocked_forever(job: JobRec) -> list[tuple[ReplicaRec, str]]:
    """Waiting replicas whose dependency can no longer be met, with the reason."""
    out = []
    for replica in waiting(job):
        if replica.restarts > 0:
            continue
        for dep in job.task(replica.task).service.depends_on:
            if condition_impossible(job.replicas_of(dep.task)):
                out.append((replica, f"dependency {dep.task} can no longer become {dep.condition}"))
                break
    return out


def unmet(job: JobRec, task: str) -> list[str]:
    """Human-readable list of what a task still waits for."""
    return [f"{d.task} {d.condition}" for d in job.task(task).service.depends_on
            if not condition_met(job.replicas_of(d.task), d.condition)]
