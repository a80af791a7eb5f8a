"""Job routes: submit, list, get, cancel, events and logs."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from corral.api import bounds
from corral.api.deps import ClockDep, IdentityDep, SessionDep, StateDep
from corral.control.commands import AskRequeue, CancelJobs, Outcome, ScaleTask, SetHold, SetPriority
from corral.api.errors import documented, invalid_parameter
from corral.api.params import ArrayId, Cursor
from corral.api.schemas import (ActionResponse, CancelResponse, EventOut, JobOut, PriorityRequest, ScaleRequest,
                                SubmitRequest, SubmitResponse)
from corral.admission import Refusal
from corral.auth.accounts import AccountRefusal, account_to_start, unreadable_as
from corral.auth.roles import Identity, Role
from corral.executors.registry import infras
from corral.runtime.discovery import peers_document
from corral.runtime.logs import LogTail, follow
from corral.spec import SpecError, load_job
from corral.spec.jobarray import parse_array
from corral.spec.models import shown
from corral.spec.world import World
from corral.states import JobState, retired
from corral.store import repository
from corral.store.ids import storable
from corral.store.repository import NewJob
from corral.store.tables import Job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=documented(401, 403))


def _job_or_404(session, ident: str, user: str | None = None) -> Job:
    job = repository.find_job(session, ident, user)
    if job is None:
        raise HTTPException(404, f"no job {shown(ident)}")
    return job


_DOING = {"cancel": "cancelling", "hold": "holding", "release": "releasing", "requeue": "requeueing",
          "scale": "scaling", "priority": "changing the priority of"}


def _acting_on(session, ident: str, who: Identity, state, action: str) -> Job:  # noqa: ANN001 - a ServerState
    """The job ``ident`` names (by name: the caller's own first), which ``who`` may change: a
    user their own, an operator any. A refusal is audited. The read's connection goes back to
    the pool before the caller waits for the control loop's lock, which itself waits for
    connections."""
    found = _job_or_404(session, ident, who.user)
    session.commit()
    doing = _DOING[action]
    try:
        who.require_on(found.user, f"{doing} a job", f"{doing} another user's job (job {found.id}, {found.user}'s)")
    except HTTPException as exc:
        state.auditor.record(who, action, f"job {found.id}", "refused", exc.detail)
        raise
    return found


def _is_operator(who: Identity) -> bool:
    return who.role.at_least(Role.operator)


@router.post("", status_code=201, response_model=SubmitResponse, responses=documented(400, 403, 413, 422))
async def submit(body: SubmitRequest, state: StateDep, who: IdentityDep):
    """Submit a task or job-group YAML. 422 lists every problem of the file with its field and
    line (or says why it can never run on this site); 403 says which role a submission (or its
    priority) needs, or that the account is not the submitter's. A name an active job of the
    submitter's already has is accepted, as Slurm does: the job's ``domain`` says under which
    name its replicas answer (``{task}-{rank}.{name}-{id}`` then)."""
    user = who.user
    # On the event loop, not a worker thread: validation is a fraction of a millisecond of CPU,
    # and the store is the intake's writer thread (group commit), awaited below.
    source = shown(body.source, 200)[1:-1] if body.source else "<spec>"
    default_name = Path(source).stem if body.source else None
    cwd = body.cwd if body.cwd is not None else body.base_dir
    world = World(cwd=cwd, export=body.export or state.site.environment.export, environment=body.environment)
    try:
        loaded = load_job(body.yaml, source=source, default_name=default_name, name=body.name, env=body.env,
                          secrets=body.secrets,
                          base_dir=cwd, scheduling=body.scheduling, workdir=body.workdir, world=world,
                          export_given=body.export is not None, drop=tuple(state.site.environment.drop),
                          task_options=body.task.model_dump(exclude_none=True) if body.task is not None else None,
                          own_dirs=_own_dirs(state.settings))
    except SpecError as exc:
        return JSONResponse(status_code=422, content={"detail": {
            "message": f"{source} is not a valid job", "errors": [i.as_dict() for i in exc.issues]}})
    spec = loaded.spec
    await _may_submit(state, who, spec.scheduling.priority, spec.scheduling.nice)
    # Like Slurm, refuse at submission what could never run here, naming the field to fix.
    named = sorted({i for _, ids in spec.scheduling.dependency for i in ids if storable(i)})  # others: no job
    known, arrays = await run_in_threadpool(_existing, state, named) if named else (set(), {})
    if arrays:  # a dependency on a job array is on every element of it, as in Slurm
        dependency = tuple((kind, tuple(dict.fromkeys(x for i in ids for x in arrays.get(i, (i,)))))
                           for kind, ids in spec.scheduling.dependency)
        spec = spec.model_copy(update={"scheduling": spec.scheduling.model_copy(update={"dependency": dependency})})
        known |= {i for members in arrays.values() for i in members}
    admitted = state.admission(spec, user, known.__contains__, any_account=who.role is Role.admin)
    if isinstance(admitted, Refusal) and admitted.forbidden:
        await run_in_threadpool(state.auditor.record, who, "submit", None, "refused", admitted.message)
        raise HTTPException(403, admitted.message)
    if isinstance(admitted, Refusal):
        return JSONResponse(status_code=422, content={"detail": {
            "message": f"{source} can never run on this site", "errors": [
                {"document": "job", "field": admitted.field, "line": None, "message": admitted.message}]}})
    try:
        run_as = state.run_as(user, admitted.partition)
    except AccountRefusal as exc:
        await run_in_threadpool(state.auditor.record, who, "submit", None, "refused", str(exc))
        raise HTTPException(403, str(exc)) from None
    # the job's account reads its mounts and enters its directories, never the server for it
    # (asked of another account through a process: off the event loop; of this one, at once)
    mounts = any(task.file_mounts for task in spec.tasks)
    refused = (await run_in_threadpool(_unreadable, spec, run_as) if _switches(run_as) or mounts
               else _unreadable(spec, run_as))
    if not refused and mounts:
        refused = await run_in_threadpool(_oversized, state, spec, admitted.partition)
    if refused:
        return JSONResponse(status_code=422, content={"detail": {
            "message": f"{source} is not a valid job", "errors": refused}})
    if body.array is not None:
        try:
            array = parse_array(body.array)
        except ValueError as exc:
            return JSONResponse(status_code=422, content={"detail": {
                "message": f"{source} is not a valid job", "errors": [
                    {"document": "options", "field": "array", "line": None, "message": str(exc)}]}})
        elements = [NewJob(spec, user, admitted.partition, admitted.account, admitted.qos, admitted.time_limit,
                           array_index=index, array_throttle=array.throttle, array_head=i == 0,
                           array_extent=array.extent, run_as=run_as)
                    for i, index in enumerate(array.indices)]
    else:
        elements = [NewJob(spec, user, admitted.partition, admitted.account, admitted.qos, admitted.time_limit,
                           run_as=run_as)]
    # the audit entries are stored with the job, in its transaction
    audit = [state.auditor.entry(who, "submit", None, detail=f"{spec.name} (account {admitted.account}, "
                                                             f"partition {admitted.partition}, qos {admitted.qos}, "
                                                             f"as Unix account {run_as})")]
    if spec.scheduling.priority is not None or spec.scheduling.nice < 0:
        fixed = spec.scheduling.priority
        audit.append(state.auditor.entry(who, "priority", None, detail=", ".join(
            ([f"priority {fixed:g}"] if fixed is not None else []) + [f"nice {spec.scheduling.nice}"])))
    stored = await asyncio.wrap_future(state.intake.submit(*elements, audit=tuple(audit)))
    if isinstance(stored, list):
        stored = stored[0]
    warnings = list(loaded.warnings)
    if not state.site.policy.grow:
        warnings += [f"task {t.name!r}: grow is off on this site (config.yaml scheduler.grow: false): it keeps "
                     "the count it is given" for t in spec.tasks if t.grow]
    body = SubmitResponse(job=JobOut.of(stored, grow=state.site.policy.grow), warnings=warnings,
                          array_size=len(elements) if body.array is not None else None)
    return Response(body.model_dump_json(), status_code=201, media_type="application/json")


def _own_dirs(settings) -> tuple[str, ...]:  # noqa: ANN001 - a Settings
    """The server's own directories, which no file_mounts remote path may shadow."""
    from corral.spec.mounts import code_dirs

    return tuple(dict.fromkeys([*(os.path.realpath(p) for p in (settings.home, settings.runtime_dir)),
                                *code_dirs()]))


def _switches(run_as: str) -> bool:
    try:
        return account_to_start(run_as) is not None
    except LookupError:
        return True  # (asked through a process, which says it cannot)


def _unreadable(spec, run_as: str) -> list[dict]:  # noqa: ANN001 - a JobSpec
    """A problem for each ``file_mounts`` source the job's Unix account could not read, and
    each working directory on this machine it could not enter (one it cannot see here may be
    a node's own: the node says so at start)."""
    sources = {source for task in spec.tasks for source in task.file_mounts.values()}
    workdirs = {task.workdir for task in spec.tasks  # (a git workdir is cloned as the account itself)
                if isinstance(task.workdir, str) and task.workdir and os.path.isdir(task.workdir)}
    if not sources and not workdirs:
        return []
    unreadable = set(unreadable_as(run_as, sorted(sources | workdirs)))
    if not unreadable:
        return []
    mounts = [{"document": f"task {task.name!r}", "field": f"file_mounts.{remote}", "line": None,
               "message": f"the Unix account {run_as} this job runs as cannot read {source}: a job mounts only "
                          f"what its account may read"}
              for task in spec.tasks for remote, source in task.file_mounts.items() if source in unreadable]
    dirs = [{"document": f"task {task.name!r}", "field": "workdir", "line": None,
             "message": f"the Unix account {run_as} this job runs as cannot enter {task.workdir}: a job runs only "
                        f"where its account may read (the submit directory when the task names no workdir)"}
            for task in spec.tasks if isinstance(task.workdir, str) and task.workdir in unreadable]
    return mounts + dirs


def _oversized(state, spec, partition: str) -> list[dict]:  # noqa: ANN001 - a ServerState, a JobSpec
    """A problem for each ``file_mounts`` source the partition's infra would refuse on its
    nodes (too large to copy for nodes that do not see it): said now, not once the job has
    queued and its replica starts (which checks again: a source may grow)."""
    name = state.site.partition_infra.get(partition)
    infra = infras().get(name) if name else None
    if infra is None or infra.mounts_check is None:
        return []
    config = state.site.infras.get(name) or infra.config()  # (no section: its defaults)
    records = state.settings.runs_dir.parent  # (where the jobs' records are: the device the nodes share)
    return [{"document": f"task {task.name!r}", "field": f"file_mounts.{remote}", "line": None, "message": why}
            for task in spec.tasks
            for remote, why in infra.mounts_check(config, records, list(task.file_mounts.items())).items()]


async def _may_submit(state, who: Identity, priority: float | None, nice: int) -> None:  # noqa: ANN001 - a ServerState
    """Role checks of a submission (a 403, audited): submitting needs a user, raising a job above
    the priority formula an operator (like Slurm, where only operators may)."""
    try:
        who.require("submitting a job", Role.user)
        if priority is not None:
            who.require("setting a job's priority", Role.operator)
        if nice < 0:
            who.require(f"a negative nice ({nice}, raising the job above others)", Role.operator)
    except HTTPException as exc:
        await run_in_threadpool(state.auditor.record, who, "submit", None, "refused", exc.detail)
        raise


def _existing(state, ids: list[int]) -> tuple[set[int], dict[int, tuple[int, ...]]]:
    """Which of ``ids`` are jobs, and the elements of those that name a job array."""
    with state.sessions() as session:
        known = set(session.scalars(select(Job.id).where(Job.id.in_(ids))))
        arrays: dict[int, list[int]] = {}
        for head, member in session.execute(select(Job.array_job_id, Job.id).where(Job.array_job_id.in_(ids))
                                            .order_by(Job.id)):
            arrays.setdefault(head, []).append(member)
        return known, {head: tuple(members) for head, members in arrays.items()}


def moment(name: str, value: str | None) -> float | None:
    """An ISO 8601 date or time as a timestamp (UTC when it names no zone); 422 otherwise."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise invalid_parameter("query", name, f"{shown(value)} is not an ISO 8601 date or time, "
                                "e.g. 2026-11-24 or 2026-11-24T13:00:00+01:00", "datetime_from_date_parsing") from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


@router.get("", response_model=list[JobOut])
def list_jobs(session: SessionDep, state_: StateDep, response: Response, all: bool = False, state: Annotated[list[str] | None, Query()] = None,
              user: str | None = None, name: str | None = None, limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
              account: str | None = None, partition: str | None = None,
              array: ArrayId = None,
              since: Annotated[str | None, Query(description="Jobs not ended before this time (ISO 8601; UTC if no zone)",
                                                 json_schema_extra={"format": "date-time"}, max_length=64)] = None,
              until: Annotated[str | None, Query(description="Jobs submitted by this time (ISO 8601)",
                                                 json_schema_extra={"format": "date-time"}, max_length=64)] = None,
              after: Cursor = None):
    """Jobs in id order: active ones, or with ``all`` ended ones too (the newest ``limit``);
    filtered by state, user, name, account, partition and a time window (like ``sacct``)."""
    states = [s.upper() for s in state or []]
    unknown = [s for s in states if s not in JobState.__members__]
    if unknown:
        raise invalid_parameter("query", "state", f"unknown state(s) {shown(unknown)}; valid: "
                                f"{', '.join(JobState.__members__)}", "enum")
    window = [moment(name, value) for name, value in (("since", since), ("until", until))]
    jobs = repository.list_jobs(session, include_ended=all, states=states, user=user, name=name, limit=limit,
                                account=account, partition=partition, since=window[0], until=window[1], after=after,
                                array=array)
    if len(jobs) == limit:
        response.headers["X-Next-After"] = str(jobs[-1].id)
    expected = dict(state_.loop.view.expected_starts)
    down = state_.loop.view.down_partitions
    predicted, waiting = state_.loop.view.predictions, state_.loop.view.waiting
    grow = state_.site.policy.grow
    return [JobOut.of(j, expected.get(j.id), down, predicted, waiting, grow) for j in jobs]


WAIT_MAX_S = 60.0  # a long poll's longest wait; clients ask again
WAIT_LOOK_S = 5.0  # a waiting poll reads its job again at least this often (what the view adds)


def _job_body(state, job: str, user: str | None) -> tuple[bytes, str, int, bool]:  # noqa: ANN001 - a ServerState
    """The job as JSON, its entity tag (a digest of exactly those bytes), its id and whether it
    has ended, read with a session of its own: a long poll holds no connection while it waits."""
    with state.sessions() as session:
        found = _job_or_404(session, job, user)
        view = state.loop.view
        out = JobOut.of(found, view.expected_starts.get(found.id), view.down_partitions, view.predictions,
                        view.waiting, state.site.policy.grow)
    body = out.model_dump_json().encode()
    return body, '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"', found.id, JobState(out.state).terminal


def _matches(if_none_match: str, tag: str) -> bool:
    """RFC 9110's weak comparison of ``If-None-Match`` (a list, ``W/`` tags, ``*``) with ``tag``."""
    candidates = [t.strip() for t in if_none_match.split(",")]
    return any(t == "*" or t.removeprefix("W/") == tag for t in candidates)


@router.get("/{job}", response_model=JobOut, responses=documented(404))
async def get_job(job: str, state: StateDep, who: IdentityDep, request: Request,
                  wait: Annotated[float, Query(ge=0, le=WAIT_MAX_S, description=(
                      "A long poll: with `If-None-Match` set to the `ETag` of the job as last seen, answer once "
                      "it differs, or as it is after this many seconds (a blocking query, as Consul's)"))] = 0):
    """The job with its tasks and replicas; its ``ETag`` changes whenever what is shown does."""
    seen = request.headers.get("if-none-match")
    waits = state.waits
    deadline = time.monotonic() + wait
    cycle = state.loop.view.cycles
    body, tag, job_id, ended = await run_in_threadpool(_job_body, state, job, who.user)  # a plain read: not shared
    ident = str(job_id)  # a name is resolved once: the poll stays on this job
    while wait and seen is not None and _matches(seen, tag) and not waits.stopping:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        # What the view adds (an expected start, a reason to wait) is looked at every few
        # seconds, on the same beat for every waiter so they share the read; an ended job has none.
        look = left if ended else min(left, WAIT_LOOK_S - time.monotonic() % WAIT_LOOK_S)
        changed = await waits.after(job_id, cycle, look)
        if not changed and time.monotonic() >= deadline:
            break  # unchanged all along: answered as it was read
        if await request.is_disconnected():  # nobody to answer: stop reading for them
            break
        cycle = state.loop.view.cycles
        body, tag, _, ended = await waits.read((job_id, who.user), cycle,
                                               lambda: run_in_threadpool(_job_body, state, ident, who.user))
    return Response(body, media_type="application/json", headers={"ETag": tag})


@router.post("/{job}/cancel", response_model=CancelResponse, responses=documented(403, 404))
def cancel(job: str, session: SessionDep, state: StateDep, who: IdentityDep, clock: ClockDep, force: bool = False):
    """Cancel a job; an array's id (its first element's) cancels every element, and
    ``ARRAYID_INDEX`` one element, as ``scancel`` does. ``force``: SIGKILL every replica now,
    without its grace period (also a job already in it), as ``scancel -s KILL``."""
    found = _acting_on(session, job, who, state, "cancel")
    whole = found.array_job_id == found.id and "_" not in job
    targets = tuple(t.id for t in repository.array_members(session, found.id)) if whole else (found.id,)
    job_id, job_state = found.id, found.state
    session.close()  # no connection held while the loop carries the change out
    done = state.change(CancelJobs(who, job_ids=targets, target=f"job {job_id}" + (" (array)" if whole else ""),
                                   force=force))
    return CancelResponse(id=job_id, cancelled=done.changed, state=job_state,
                          elements=len(done.ids) if whole else None)


def _named(found: Job) -> str:
    """A job as its user names it: an array element as ARRAY_INDEX (as squeue shows it)."""
    return f"{found.array_job_id}_{found.array_index}" if found.array_job_id is not None else str(found.id)


def _elements(session, found: Job, ident: str) -> list[Job] | None:  # noqa: ANN001
    """Every element of the array ``ident`` names by its id (its first element's), as Slurm's
    ``scontrol hold|release|requeue ARRAYID`` acts on the whole array; None for one job."""
    if found.array_job_id != found.id or "_" in ident:
        return None
    return repository.array_members(session, found.id)


def _on_array(state, head: Job, changes: list, verb: str, able: Callable[[Outcome], bool],  # noqa: ANN001
              refusal: str) -> ActionResponse:
    """Carry ``changes`` (one per element) out together and say what became of the array;
    ``able``: whether an element was one the action applies to (none: a 409, as for one job)."""
    outcomes = state.changes(changes)
    changed = sum(o.changed for o in outcomes)
    if not changed and not any(map(able, outcomes)):
        raise HTTPException(409, f"array {head.id}: {refusal}")
    return ActionResponse(id=head.id, changed=changed > 0, state=outcomes[0].state or head.state,
                          hold=outcomes[0].hold, elements=changed,
                          message=f"array {head.id}: {changed} of {len(outcomes)} element(s) {verb}")


@router.post("/{job}/hold", response_model=ActionResponse, responses=documented(403, 404, 409))
def hold(job: str, session: SessionDep, state: StateDep, who: IdentityDep, clock: ClockDep):
    """Keep a pending job from starting (Slurm's ``scontrol hold``): reason JobHeldUser, or
    JobHeldAdmin when an operator holds another user's job (then only an operator releases it).
    An array's id holds every pending element of it, ``ARRAYID_INDEX`` one."""
    found = _acting_on(session, job, who, state, "hold")
    kind = "admin" if _is_operator(who) and who.user != found.user else "user"
    job_id, label, members = found.id, _named(found), _elements(session, found, job)
    session.close()  # no connection held while the loop carries the change out
    if members is not None:
        return _on_array(state, found, [SetHold(who, job_id=m.id, kind=kind) for m in members], "held",
                         lambda o: o.state == JobState.PENDING.value and not o.cancelling,
                         "no element is pending; only pending elements are held")
    done = state.change(SetHold(who, job_id=job_id, kind=kind))
    if not done.changed and (done.state != JobState.PENDING.value or done.cancelling):
        raise HTTPException(409, f"job {label} is {done.state}{' and being cancelled' if done.cancelling else ''}; "
                                 "only a pending job can be held (`corral requeue --hold` stops a running one and holds it)")
    return ActionResponse(id=job_id, changed=done.changed, state=done.state, hold=done.hold,
                          message=f"job {label} held" if done.changed else f"job {label} was already held")


@router.post("/{job}/release", response_model=ActionResponse, responses=documented(403, 404))
def release(job: str, session: SessionDep, state: StateDep, who: IdentityDep, clock: ClockDep):
    """Let a held job be scheduled again (Slurm's ``scontrol release``); an array's id
    releases every held element of it."""
    found = _acting_on(session, job, who, state, "release")
    operator = _is_operator(who)
    job_id, label, members = found.id, _named(found), _elements(session, found, job)
    doing = f"releasing job {label}, which an operator held (JobHeldAdmin),"
    if any(m.hold == "admin" for m in members or [found]) and not operator:
        state.auditor.record(who, "release", f"job {found.id}", "refused", "held by an operator")
        raise who.refuse(doing, Role.operator)
    session.close()  # no connection held while the loop carries the change out
    if members is not None:
        return _on_array(state, found, [SetHold(who, job_id=m.id, kind="", operator=operator) for m in members],
                         "released", lambda o: bool(o.hold), "no element is held")
    done = state.change(SetHold(who, job_id=job_id, kind="", operator=operator))
    if done.refused:  # an operator held it meanwhile
        raise who.refuse(doing, Role.operator)
    return ActionResponse(id=job_id, changed=done.changed, state=done.state, hold=done.hold,
                          message=f"job {label} released" if done.changed else f"job {label} was not held")


@router.post("/{job}/requeue", response_model=ActionResponse, responses=documented(403, 404, 409))
def requeue(job: str, session: SessionDep, state: StateDep, who: IdentityDep, clock: ClockDep,
            hold: Annotated[bool, Query(description="Hold it once it is pending again (scontrol requeuehold)")] = False):
    """Stop a starting or running job (every replica gets its stop signal and grace period) and
    put it back in the queue under the same id, names and checkpoint directory
    (``CORRAL_RESTART_COUNT`` goes up), like Slurm's ``scontrol requeue``; an array's id
    requeues every starting or running element of it."""
    found = _acting_on(session, job, who, state, "requeue")
    kind = ("admin" if _is_operator(who) and who.user != found.user else "user") if hold else ""
    job_id, label, members = found.id, _named(found), _elements(session, found, job)
    session.close()  # no connection held while the loop carries the change out
    if members is not None:
        return _on_array(state, found, [AskRequeue(who, job_id=m.id, hold=kind) for m in members], "requeueing",
                         lambda o: o.requeueing, "no element is starting or running; only those can be requeued")
    done = state.change(AskRequeue(who, job_id=job_id, hold=kind))
    if not done.changed and (not done.requeueing or JobState(done.state).terminal):
        raise HTTPException(409, f"job {label} is {done.state}"
                                 f"{' and being cancelled' if done.cancelling else ''}; only a starting or "
                                 "running job can be requeued" + ("" if done.state == JobState.PENDING.value else
                                                                   " (launch an ended one again)"))
    return ActionResponse(id=job_id, changed=done.changed, state=done.state, hold=done.hold,
                          message=f"job {label} requeueing" if done.changed else f"job {label} is already requeueing")


@router.post("/{job}/scale", response_model=JobOut, responses=documented(400, 403, 404, 409, 413))
def scale(job: str, body: ScaleRequest, session: SessionDep, state: StateDep, who: IdentityDep, clock: ClockDep):
    """Set a task's replica count within its elastic bounds, and/or the bounds themselves
    (``min_nodes``/``max_nodes``); a count alone on an autoscaled task pins both bounds to it
    (``corral.api.bounds``). The control loop places new replicas or stops the highest ranks
    with the task's stop signal and grace period."""
    found = _acting_on(session, job, who, state, "scale")
    if found.state not in (JobState.STARTING.value, JobState.RUNNING.value):
        raise HTTPException(409, f"job {found.id} is {found.state}; only a starting or running job can be scaled")
    spec = next((t for t in found.spec["tasks"] if t["name"] == body.task), None)
    row = next((t for t in found.tasks if t.name == body.task), None)
    if spec is None or row is None:
        raise HTTPException(404, f"job {found.id} has no task {body.task!r}; it has "
                                 f"{', '.join(t['name'] for t in found.spec['tasks'])}")
    partition = found.partition or ""
    asked = bounds.decide(body, spec, row, lambda request: state.admission.never_holds(partition, request))
    job_id = found.id
    session.close()  # no connection held while the loop carries the change out
    state.change(ScaleTask(who, job_id=job_id, task=body.task, replicas=asked.replicas, bounds=asked.bounds,
                           why=asked.why, fixed=asked.fixed))
    return JobOut.of(repository.load_job(session, job_id), grow=state.site.policy.grow)


@router.post("/{job}/priority", response_model=JobOut, responses=documented(400, 404, 409, 413, 422))
def reprioritize(job: str, body: PriorityRequest, session: SessionDep, state: StateDep, who: IdentityDep,
                 clock: ClockDep):
    """Change a pending job's fixed ``priority`` (operators) or ``nice`` (its owner may raise it,
    which lowers the job; a negative one is for operators), like Slurm's ``scontrol update``."""
    changes = body.model_dump(include=body.model_fields_set)
    if not changes:
        raise invalid_parameter("body", "priority", "give priority and/or nice")
    found = _acting_on(session, job, who, state, "priority")
    try:
        if "priority" in changes:
            who.require("setting a job's priority", Role.operator)
        if changes.get("nice") is None:
            changes.pop("nice", None)
        elif changes["nice"] < 0:
            who.require(f"a negative nice ({changes['nice']}, raising the job above others)", Role.operator)
    except HTTPException as exc:
        state.auditor.record(who, "priority", f"job {found.id}", "refused", exc.detail)
        raise
    if not changes:
        raise invalid_parameter("body", "nice", "nice is a whole number; leave it out to keep it")
    job_id = found.id
    session.close()  # no connection held while the loop carries the change out
    done = state.change(SetPriority(who, job_id=job_id, values=changes))
    if not done.changed:
        raise HTTPException(409, f"job {job_id} is {done.state}"
                                 f"{' and being cancelled' if done.cancelling else ''}; only a pending "
                                 "job's priority can change")
    return JobOut.of(repository.load_job(session, job_id), grow=state.site.policy.grow)


@router.get("/{job}/endpoints", responses=documented(404))
def endpoints(job: str, session: SessionDep, clock: ClockDep, who: IdentityDep) -> dict:
    """Every replica of every task with rank, name, address, ports, state and readiness:
    the same document as the job's CORRAL_PEERS_FILE."""
    found = _job_or_404(session, job, who.user)
    specs = {t["name"]: t for t in found.spec["tasks"]}
    tasks = [{"name": t.name, "ports": specs[t.name].get("ports") or {},
              "replicas": [{"rank": r.rank, "addr": r.addr, "state": r.state, "ready": bool(r.ready),
                            "restarts": r.restarts} for r in found.replicas if r.task == t.name and not retired(r.stop_cause, r.state)]}
             for t in found.tasks]
    document = peers_document(found.id, found.name, tasks, clock(), found.domain)
    live = found.state in (JobState.STARTING.value, JobState.RUNNING.value)
    document["endpoints"] = {t.name: f"127.0.0.1:{t.endpoint_port}" for t in found.tasks if t.endpoint_port and live}
    return document


@router.get("/{job}/events", response_model=list[EventOut], responses=documented(404))
def events(job: str, session: SessionDep, who: IdentityDep):
    """The job's story. Messages (which may quote a replica's output or a probe's) are shown to
    the job's owner and operators; others see each transition and its cause only."""
    found = _job_or_404(session, job, who.user)
    inside = who.may_see_inside(found.user)
    return [EventOut.of(e, with_message=inside) for e in repository.job_events(session, found.id)]


@router.get("/{job}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Log lines"},
                       **documented(404, 429)})
async def logs(job: str, state: StateDep, who: IdentityDep, replica: str | None = None, follow_logs: Annotated[bool, Query(alias="follow")] = False,
               prefix: bool | None = None,
               tail: Annotated[int | None, Query(ge=0, le=10_000_000, description="Only the last N lines of each replica's log, then (with follow) what comes")] = None):
    def lookup():
        with state.sessions() as session:
            found = _job_or_404(session, job, who.user)
            return found.id, found.user, [(r.label, r.task, r.rank) for r in found.replicas]

    job_id, owner, labels = await run_in_threadpool(lookup)
    who.require_inside(owner, "logs")
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

    # a revoked (or expired) token ends the stream it opened
    content = follow(reader, ended, allowed=lambda: state.tokens.live(who.token_id)) if follow_logs else reader.drain()
    return state.streams.open(who, content, "text/plain")
