"""Queries and writes that the API and the control loop share. The API only inserts jobs
and records requests (cancel); the control loop alone moves states."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update
from sqlalchemy.orm import Session, selectinload

from corral.spec.models import JobSpec
from corral.states import TERMINAL_JOB_STATES, JobState, ReplicaState
from corral.store.tables import Event, Job, Replica, Task

TERMINAL = [s.value for s in TERMINAL_JOB_STATES]


def add_event(session: Session, job_id: int, ts: float, subject: str, cause: str,
              from_state: str | None = None, to_state: str | None = None, message: str | None = None) -> None:
    session.add(Event(job_id=job_id, ts=ts, subject=subject, from_state=from_state, to_state=to_state,
                      cause=cause, message=message))


def create_job(session: Session, spec: JobSpec, user: str, now: float) -> Job:
    job = Job(name=spec.name, user=user, state=JobState.PENDING.value, reason="None",
              spec=spec.model_dump(mode="json"), is_group=spec.group, submitted_at=now, version=0)
    for position, task in enumerate(spec.tasks):
        job.tasks.append(Task(position=position, name=task.name, primary=task.name in spec.primary_tasks,
                              num_nodes=task.num_nodes, gpus=task.resources.gpus, gpu_type=task.resources.gpu_type,
                              cpus=task.resources.cpus, memory=task.resources.memory,
                              grace_period=task.grace_period,
                              termination_delay=spec.termination_delay.get(task.name, 0.0)))
        for rank in range(task.num_nodes):
            job.replicas.append(Replica(task=task.name, task_position=position, rank=rank,
                                        state=ReplicaState.PENDING.value, gpus=[], cpus=0.0, memory=0.0,
                                        restarts=0))
    session.add(job)
    session.flush()
    add_event(session, job.id, now, "job", "submitted", None, JobState.PENDING.value,
              f"submitted by {user}: {len(spec.tasks)} task(s), {sum(t.num_nodes for t in spec.tasks)} replica(s)")
    return job


def load_job(session: Session, job_id: int) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id)
                           .options(selectinload(Job.tasks), selectinload(Job.replicas))).first()


def find_job(session: Session, ident: str) -> Job | None:
    """A job by id, or the newest job with that name."""
    if ident.isdigit():
        return load_job(session, int(ident))
    job_id = session.scalars(select(Job.id).where(Job.name == ident).order_by(Job.id.desc()).limit(1)).first()
    return load_job(session, job_id) if job_id is not None else None


def list_jobs(session: Session, *, include_ended: bool = False, states: Iterable[str] = (),
              user: str | None = None, name: str | None = None, limit: int = 1000) -> list[Job]:
    query = select(Job).options(selectinload(Job.tasks), selectinload(Job.replicas)).order_by(Job.id)
    states = list(states)
    if states:
        query = query.where(Job.state.in_(states))
    elif not include_ended:
        query = query.where(Job.state.not_in(TERMINAL))
    if user:
        query = query.where(Job.user == user)
    if name:
        query = query.where(Job.name == name)
    if include_ended and not states:
        # newest ended jobs first when the history is long, then back to id order
        return sorted(session.scalars(query.order_by(None).order_by(Job.id.desc()).limit(limit)).all(),
                      key=lambda j: j.id)
    return list(session.scalars(query.limit(limit)).all())


def request_cancel(session: Session, job: Job, now: float, by: str) -> bool:
    """Record the wish to cancel; False when the job has already ended."""
    result = session.execute(update(Job).where(Job.id == job.id, Job.state.not_in(TERMINAL),
                                               Job.cancel_requested_at.is_(None))
                             .values(cancel_requested_at=now, version=Job.version + 1))
    if result.rowcount:
        add_event(session, job.id, now, "job", "cancel_requested", message=f"cancel requested by {by}")
        return True
    return False


def job_events(session: Session, job_id: int) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)).all())
