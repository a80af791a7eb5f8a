"""Job routes: submit, list, get, cancel, events and logs."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from corral.api.deps import ClockDep, SessionDep, StateDep, UserDep
from corral.api.errors import documented, invalid_parameter
from corral.api.intake import Clash
from corral.api.schemas import ActionResponse, CancelResponse, EventOut, JobOut, ScaleRequest, SubmitRequest, SubmitResponse
from corral.admission import Refusal
from corral.runtime.discovery import peers_document
from corral.runtime.logs import LogTail, follow
from corral.spec import SpecError, load_job
from corral.spec.models import shown
from corral.states import JobState, retired
from corral.store import repository
from corral.store.repository import NewJob
from corral.store.tables import Job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _job_or_404(session, ident: str, user: str | None = None) -> Job:
    job = repository.find_job(session, ident, user)
    if job is None:
        raise HTTPException(404, f"no job {shown(ident)}")
    return job


def _acting_on(session, ident: str, user: str, state, action: str) -> Job:  # noqa: ANN001 - a ServerState
    """The job ``ident`` names (by name: the user's own first), which ``user`` may change: their
    own, or any if they are an operator. The read's connection goes back to the pool before
    the caller waits for the control loop's lock, which itself waits for connections."""
    found = _job_or_404(session, ident, user)
    if found.user != user and user not in state.site.operators:
        raise HTTPException(403, f"job {found.id} belongs to {found.user}; only its owner or an operator "
                                 f"({', '.join(state.site.operators) or 'none configured'}) may {action} it")
    session.commit()
    return found


@router.post("", status_code=201, response_model=SubmitResponse, responses=documented(400, 409, 413, 422))
async def submit(body: SubmitRequest, state: StateDep, user: UserDep):
    """Submit a task or job-group YAML. 422 lists every problem of the file with its field and
    line (or says why it can never run on this site); 409 names the active job of the same name."""
    # On the event loop, not a worker thread: validation is a fraction of a millisecond of CPU,
    # and the store is the intake's writer thread (group commit), awaited below.
    source = shown(body.source, 200)[1:-1] if body.source else "<spec>"
    default_name = Path(source).stem if body.source else None
    try:
        loaded = load_job(body.yaml, source=source, default_name=default_name, name=body.name, env=body.env,
                          base_dir=body.base_dir, scheduling=body.scheduling)
    except SpecError as exc:
        return JSONResponse(status_code=422, content={"detail": {
            "message": f"{source} is not a valid job", "errors": [i.as_dict() for i in exc.issues]}})
    spec = loaded.spec
    # Like Slurm, refuse at submission what could never run here, naming the field to fix.
    named = sorted({i for _, ids in spec.scheduling.dependency for i in ids if 0 < i < 2**63})
    known = await run_in_threadpool(_existing, state, named) if named else set()
    admitted = state.admission(spec, user, known.__contains__)
    if isinstance(admitted, Refusal):
        return JSONResponse(status_code=422, content={"detail": {
            "message": f"{source} can never run on this site", "errors": [
                {"document": "job", "field": admitted.field, "line": None, "message": admitted.message}]}})
    stored = state.intake.submit(NewJob(spec, user, admitted.partition, admitted.account, admitted.qos,
                                        admitted.time_limit))
    stored = await asyncio.wrap_future(stored)
    if isinstance(stored, Clash):
        return JSONResponse(status_code=409, content={"detail": (
            f"you already have an active job named {spec.name!r} (job {stored.job_id}); replica names "
            f"like {spec.tasks[0].name}-0.{spec.name} must be unambiguous: pick another name "
            f"(--name), cancel job {stored.job_id}, or queue it behind with dependency: singleton")})
    job = stored
    body = SubmitResponse(job=JobOut.of(job), warnings=loaded.warnings)
    return Response(body.model_dump_json(), status_code=201, media_type="application/json")


def _existing(state, ids: list[int]) -> set[int]:
    with state.sessions() as session:
        return set(session.scalars(select(Job.id).where(Job.id.in_(ids))))


def _moment(name: str, value: str | None) -> float | None:
    """An ISO 8601 date or time as a timestamp (UTC when it names no zone); 422 otherwise."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise invalid_parameter("query", name, f"{shown(value)} is not an ISO 8601 date or time, "
                                "e.g. 2026-11-24 or 2026-11-24T13:00:00+01:00", "datetime_from_date_parsing") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


@router.get("", response_model=list[JobOut])
def list_jobs(session: SessionDep, state_: StateDep, response: Response, all: bool = False, state: Annotated[list[str] | None, Query()] = None,
              user: str | None = None, name: str | None = None, limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
              account: str | None = None, partition: str | None = None,
              since: Annotated[str | None, Query(description="Jobs not ended before this time (ISO 8601; UTC if no zone)",
                                                 json_schema_extra={"format": "date-time"}, max_length=64)] = None,
              until: Annotated[str | None, Query(description="Jobs submitted by this time (ISO 8601)",
                                                 json_schema_extra={"format": "date-time"}, max_length=64)] = None,
              after: Annotated[int | None, Query(ge=0, lt=2**63, description=(
                  "Cursor: jobs with a higher id, oldest first. A full page answers with the next "
                  "cursor in the X-Next-After header"))] = None):
    """Jobs in id order: active ones, or with ``all`` ended ones too (the newest ``limit``);
    filtered by state, user, name, account, partition and a time window (like ``sacct``)."""
    states = [s.upper() for s in state or []]
    unknown = [s for s in states if s not in JobState.__members__]
    if unknown:
        raise invalid_parameter("query", "state", f"unknown state(s) {shown(unknown)}; valid: "
                                f"{', '.join(JobState.__members__)}", "enum")
    window = [_moment(name, value) for name, value in (("since", since), ("until", until))]
    jobs = repository.list_jobs(session, include_ended=all, states=states, user=user, name=name, limit=limit,
                                account=account, partition=partition, since=window[0], until=window[1], after=after)
    if len(jobs) == limit:
        response.headers["X-Next-After"] = str(jobs[-1].id)
    expected = dict(state_.controller.expected_starts)
    return [JobOut.of(j, expected.get(j.id)) for j in jobs]


@router.get("/{job}", response_model=JobOut, responses=documented(404))
def get_job(job: str, session: SessionDep, state: StateDep, user: UserDep):
    found = _job_or_404(session, job, user)
    return JobOut.of(found, state.controller.expected_starts.get(found.id))


@router.post("/{job}/cancel", response_model=CancelResponse, responses=documented(403, 404))
def cancel(job: str, session: SessionDep, state: StateDep, user: UserDep, clock: ClockDep):
    found = _acting_on(session, job, user, state, "cancel")
    with state.controller.write_lock:
        changed = repository.request_cancel(session, found, clock(), user)
        session.commit()
    if changed:
        state.controller.cancel_requested(found.id)
    return CancelResponse(id=found.id, cancelled=changed, state=found.state)


@router.post("/{job}/hold", response_model=ActionResponse, responses=documented(403, 404, 409))
def hold(job: str, session: SessionDep, state: StateDep, user: UserDep, clock: ClockDep):
    """Keep a pending job from starting (Slurm's ``scontrol hold``): reason JobHeldUser, or
    JobHeldAdmin when an operator holds another user's job (then only an operator releases it)."""
    found = _acting_on(session, job, user, state, "hold")
    kind = "admin" if user in state.site.operators and user != found.user else "user"
    with state.controller.write_lock:
        changed = repository.set_hold(session, found, kind, clock(), user)
        session.commit()
    session.refresh(found)
    if changed:
        state.controller.hold_changed(found.id, True)
    elif found.state != JobState.PENDING.value or found.cancel_requested_at is not None:
        raise HTTPException(409, f"job {found.id} is {found.state}{' and being cancelled' if found.cancel_requested_at else ''}; "
                                 "only a pending job can be held (`corral requeue --hold` stops a running one and holds it)")
    return ActionResponse(id=found.id, changed=changed, state=found.state, hold=found.hold,
                          message=f"job {found.id} held" if changed else f"job {found.id} was already held")


@router.post("/{job}/release", response_model=ActionResponse, responses=documented(403, 404))
def release(job: str, session: SessionDep, state: StateDep, user: UserDep, clock: ClockDep):
    """Let a held job be scheduled again (Slurm's ``scontrol release``)."""
    found = _acting_on(session, job, user, state, "release")
    operator = user in state.site.operators
    if found.hold == "admin" and not operator:
        raise HTTPException(403, f"job {found.id} was held by an operator (JobHeldAdmin); only an operator "
                                 f"({', '.join(state.site.operators) or 'none configured'}) may release it")
    with state.controller.write_lock:
        changed = repository.set_hold(session, found, "", clock(), user, operator)
        session.commit()
    session.refresh(found)
    if not changed and found.hold == "admin" and not operator:  # an operator held it meanwhile
        raise HTTPException(403, f"job {found.id} was held by an operator (JobHeldAdmin); only an operator may "
                                 "release it")
    if changed:
        state.controller.hold_changed(found.id, False)
    return ActionResponse(id=found.id, changed=changed, state=found.state, hold=found.hold,
                          message=f"job {found.id} released" if changed else f"job {found.id} was not held")


@router.post("/{job}/requeue", response_model=ActionResponse, responses=documented(403, 404, 409))
def requeue(job: str, session: SessionDep, state: StateDep, user: UserDep, clock: ClockDep,
            hold: Annotated[bool, Query(description="Hold it once it is pending again (scontrol requeuehold)")] = False):
    """Stop a starting or running job (every replica gets its stop signal and grace period) and
    put it back in the queue under the same id, names and checkpoint directory
    (``CORRAL_RESTART_COUNT`` goes up), like Slurm's ``scontrol requeue``."""
    found = _acting_on(session, job, user, state, "requeue")
    kind = ("admin" if user in state.site.operators and user != found.user else "user") if hold else ""
    with state.controller.write_lock:
        changed = repository.request_requeue(session, found, clock(), user, kind)
        session.commit()
    session.refresh(found)
    if changed:
        state.controller.requeue_requested(found.id)
    elif found.requeue_requested_at is None or JobState(found.state).terminal:
        raise HTTPException(409, f"job {found.id} is {found.state}"
                                 f"{' and being cancelled' if found.cancel_requested_at else ''}; only a starting or "
                                 "running job can be requeued" + ("" if found.state == JobState.PENDING.value else
                                                                   " (launch an ended one again)"))
    return ActionResponse(id=found.id, changed=changed, state=found.state, hold=found.hold,
                          message=f"job {found.id} requeueing" if changed else f"job {found.id} is already requeueing")


@router.post("/{job}/scale", response_model=JobOut, responses=documented(400, 403, 404, 409, 413))
def scale(job: str, body: ScaleRequest, session: SessionDep, state: StateDep, user: UserDep, clock: ClockDep):
    """Set a task's replica count within its elastic bounds; the control loop places new
    replicas or stops the highest ranks with the task's stop signal and grace period."""
    found = _acting_on(session, job, user, state, "scale")
    if found.state not in (JobState.STARTING.value, JobState.RUNNING.value):
        raise HTTPException(409, f"job {found.id} is {found.state}; only a starting or running job can be scaled")
    spec = next((t for t in found.spec["tasks"] if t["name"] == body.task), None)
    if spec is None:
        raise HTTPException(404, f"job {found.id} has no task {body.task!r}; it has "
                                 f"{', '.join(t['name'] for t in found.spec['tasks'])}")
    low, high = spec.get("min_nodes") or spec["num_nodes"], spec.get("max_nodes") or spec["num_nodes"]
    if not low <= body.replicas <= high:
        detail = (f"task {body.task!r} is not elastic: num_nodes is fixed at {low}" if low == high else
                  f"task {body.task!r} scales between {low} and {high} replicas (num_nodes: {{min: {low}, max: {high}}})")
        raise invalid_parameter("body", "replicas", detail)
    with state.controller.write_lock:
        repository.set_desired_replicas(session, found.id, body.task, body.replicas)
        repository.add_event(session, found.id, clock(), body.task, "scale_requested",
                             message=f"{user} asked for {body.replicas} replica(s)")
        session.commit()
    state.controller.scale_requested(found.id, body.task, body.replicas)
    session.expire_all()
    return JobOut.of(repository.load_job(session, found.id))


@router.get("/{job}/endpoints", responses=documented(404))
def endpoints(job: str, session: SessionDep, clock: ClockDep, user: UserDep) -> dict:
    """Every replica of every task with rank, name, address, ports, state and readiness:
    the same document as the job's CORRAL_PEERS_FILE."""
    found = _job_or_404(session, job, user)
    specs = {t["name"]: t for t in found.spec["tasks"]}
    tasks = [{"name": t.name, "ports": specs[t.name].get("ports") or {},
              "replicas": [{"rank": r.rank, "addr": r.addr, "state": r.state, "ready": bool(r.ready),
                            "restarts": r.restarts} for r in found.replicas if r.task == t.name and not retired(r.stop_cause, r.state)]}
             for t in found.tasks]
    document = peers_document(found.id, found.name, tasks, clock())
    live = found.state in (JobState.STARTING.value, JobState.RUNNING.value)
    document["endpoints"] = {t.name: f"127.0.0.1:{t.endpoint_port}" for t in found.tasks if t.endpoint_port and live}
    return document


@router.get("/{job}/events", response_model=list[EventOut], responses=documented(404))
def events(job: str, session: SessionDep, user: UserDep):
    found = _job_or_404(session, job, user)
    return [EventOut.of(e) for e in repository.job_events(session, found.id)]


@router.get("/{job}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Log lines"},
                       **documented(404)})
async def logs(job: str, state: StateDep, user: UserDep, replica: str | None = None, follow_logs: Annotated[bool, Query(alias="follow")] = False,
               prefix: bool | None = None,
               tail: Annotated[int | None, Query(ge=0, le=10_000_000, description="Only the last N lines of each replica's log, then (with follow) what comes")] = None):
    def lookup():
        with state.sessions() as session:
            found = _job_or_404(session, job, user)
            return found.id, [(r.label, r.task, r.rank) for r in found.replicas]

    job_id, labels = await run_in_threadpool(lookup)
    logs_dir = state.settings.logs_dir / str(job_id)
    files = {label: logs_dir / f"{label}.log" for label, _, _ in labels}
    if replica is not None:
        if replica not in files:
            raise HTTPException(404, f"job {job_id} has no replica {replica!r}; it has {', '.join(files)}")
        files = {replica: files[replica]}
    reader = LogTail(files, prefix=len(files) > 1 if prefix is None else prefix)
    if tail is not None:
        await run_in_threadpool(reader.keep_last, tail)

    async def ended() -> bool:
        def check():
            with state.sessions() as session:
                found = repository.load_job(session, job_id)
                return found is None or JobState(found.state).terminal

        return await run_in_threadpool(check)

    if not follow_logs:
        return StreamingResponse(reader.drain(), media_type="text/plain")
    return StreamingResponse(follow(reader, ended), media_type="text/plain")
