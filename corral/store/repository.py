"""Queries and writes that the API and the control loop share. The API only inserts jobs
and records requests (cancel); the control loop alone moves states."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy import and_, bindparam, case, func, insert, or_, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, selectinload

from corral.spec.models import NAME_RE, JobSpec
from corral.states import TERMINAL_JOB_STATES, JobState, Reason, ReplicaState
from corral.store.ids import is_number, parse_id
from corral.store.tables import Event, Job, Replica, Task

TERMINAL = [s.value for s in TERMINAL_JOB_STATES]

# Statements built once: values travel as parameters, so SQLAlchemy compiles each only once.
_JOBS, _TASKS, _REPLICAS, _EVENTS = Job.__table__, Task.__table__, Replica.__table__, Event.__table__
_INSERT_TASKS = insert(_TASKS).returning(_TASKS.c.id, sort_by_parameter_order=True)
_INSERT_REPLICAS = insert(_REPLICAS).returning(_REPLICAS.c.id, sort_by_parameter_order=True)
_INSERT_EVENT = insert(_EVENTS)


def add_event(session: Session, job_id: int, ts: float, subject: str, cause: str,
              from_state: str | None = None, to_state: str | None = None, message: str | None = None) -> None:
    session.connection().execute(_INSERT_EVENT, {"job_id": job_id, "ts": ts, "subject": subject, "cause": cause,
                                                 "from_state": from_state, "to_state": to_state, "message": message})


def create_job(session: Session, spec: JobSpec, user: str, now: float, *, partition: str = "", account: str = "",
               qos: str = "", time_limit: float | None = None) -> SimpleNamespace:
    """Insert one job with its tasks, replicas and first event (see ``create_jobs``)."""
    return create_jobs(session, [NewJob(spec, user, partition, account, qos, time_limit)], now)[0]


@dataclass(frozen=True)
class NewJob:
    """A validated, admitted submission; ``partition``, ``account``, ``qos`` and
    ``time_limit`` are as the site resolved them."""

    spec: JobSpec
    user: str
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: float | None = None
    # an element of a job array: its index, the array's throttle, and whether it is the
    # array's first element (the elements of one array are consecutive in a batch)
    array_index: int | None = None
    array_throttle: int | None = None
    array_head: bool = False
    array_extent: tuple[int, int, int, int] | None = None  # the array's (count, min, max, step)
    run_as: str | None = None  # the Unix account its replicas run as (``auth.accounts``)


_INSERT_JOBS = insert(_JOBS).returning(_JOBS.c.id, sort_by_parameter_order=True)
# inline: no implicit RETURNING of a single row's key, which a pipeline cannot hand back before it syncs
_PLAIN_INSERTS = {table.name: insert(table).inline() for table in (_JOBS, _TASKS, _REPLICAS, _EVENTS)}
_NEXT_IDS = text("SELECT (SELECT array_agg(nextval(pg_get_serial_sequence('jobs', 'id'))) "
                 "FROM generate_series(1, :jobs)), "
                 "(SELECT array_agg(nextval(pg_get_serial_sequence('tasks', 'id'))) FROM generate_series(1, :tasks)), "
                 "(SELECT array_agg(nextval(pg_get_serial_sequence('replicas', 'id'))) "
                 "FROM generate_series(1, :replicas))")


def create_jobs(session: Session, new: list[NewJob], now: float) -> list[SimpleNamespace]:
    """Insert jobs with their tasks, replicas and first events, a few statements for the whole
    batch (the submit hot path). Returns the rows as plain objects with ids filled in, shaped
    like the ORM classes (``job.tasks``, ``job.replicas``) so readers of either need not care.

    SQLite (in process) numbers the rows with RETURNING, a statement per table. Over a network
    each statement is a round trip, so PostgreSQL takes every id the batch needs from the
    sequences in one query and sends the four inserts as one pipeline."""
    conn = session.connection()
    jobs = [_job_row(item, now) for item in new]
    if conn.dialect.name == "postgresql":
        counts = {"jobs": len(jobs), "tasks": sum(len(i.spec.tasks) for i in new),
                  "replicas": sum(t.num_nodes for i in new for t in i.spec.tasks)}
        job_ids, task_ids, replica_ids = (iter(sorted(ids or ())) for ids in conn.execute(_NEXT_IDS, counts).one())
        for job, item in zip(jobs, new):
            job.id = next(job_ids)
            _children(job, item, task_ids, replica_ids)
        _name_arrays(jobs, new)  # the ids are known before the inserts: the rows carry their array
        # psycopg sends the four together, one round trip; another driver, one after another
        raw, dbapi_error = conn.connection.dbapi_connection, conn.dialect.loaded_dbapi.Error
        try:
            with raw.pipeline() if conn.dialect.driver == "psycopg" else contextlib.nullcontext():
                conn.execute(_PLAIN_INSERTS["jobs"], [_columns(j) for j in jobs])
                conn.execute(_PLAIN_INSERTS["tasks"], [vars(t) for j in jobs for t in j.tasks])
                conn.execute(_PLAIN_INSERTS["replicas"], [vars(r) for j in jobs for r in j.replicas])
                conn.execute(_PLAIN_INSERTS["events"], [_first_event(job, item, now) for job, item in zip(jobs, new)])
        except dbapi_error as exc:  # raised as the pipeline syncs, where SQLAlchemy does not translate it
            raise DBAPIError.instance(None, None, exc, dbapi_error) from exc
    else:
        for job, new_id in zip(jobs, conn.execute(_INSERT_JOBS, [_columns(j) for j in jobs]).scalars().all()):
            job.id = new_id
        members = _name_arrays(jobs, new)  # numbered by the insert: the array column is set after it
        if members:
            conn.execute(update(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
                         .values(array_job_id=bindparam("array")), members)
        for job, item in zip(jobs, new):
            _children(job, item)
        for stmt, rows in ((_INSERT_TASKS, [t for j in jobs for t in j.tasks]),
                           (_INSERT_REPLICAS, [r for j in jobs for r in j.replicas])):
            for row, new_id in zip(rows, conn.execute(stmt, [vars(r) for r in rows]).scalars().all()):
                row.id = new_id
        conn.execute(_INSERT_EVENT, [_first_event(job, item, now) for job, item in zip(jobs, new)])
    for job, item in zip(jobs, new):
        job.validated = item.spec  # what ``spec`` was dumped from: its reader need not validate it again
    return jobs


def _job_row(item: NewJob, now: float) -> SimpleNamespace:
    spec, sched = item.spec, item.spec.scheduling
    return SimpleNamespace(
        name=spec.name, user=item.user, state=JobState.PENDING.value,
        reason=Reason.HELD_USER.value if sched.hold else "None", message=None, exit_code=None,
        spec=spec.model_dump(mode="json") | ({"array_extent": list(item.array_extent)} if item.array_extent else {}),
        is_group=spec.group, submitted_at=now, started_at=None, ended_at=None,
        cancel_requested_at=None, version=0, partition=item.partition, account=item.account or item.user,
        qos=item.qos, nice=sched.nice, priority=sched.priority,
        time_limit=item.time_limit if item.time_limit is not None else spec.time_limit,
        dependency=[[kind, list(ids)] for kind, ids in sched.dependency] or None,
        kill_on_invalid_dep=sched.kill_on_invalid_dep, requeues=0, hold="user" if sched.hold else "",
        requeue_requested_at=None, array_job_id=None, array_index=item.array_index,
        array_throttle=item.array_throttle, run_as=item.run_as, domain=None)


def _name_arrays(jobs: list[SimpleNamespace], new: list[NewJob]) -> list[dict]:
    """Each array element's ``array_job_id``: an array is named by its first element's id (the
    elements of one array are consecutive in a batch). Returns (job_id, array) pairs to store."""
    head = None
    for job, item in zip(jobs, new):
        if item.array_index is not None:
            head = job.id if item.array_head or head is None else head
            job.array_job_id = head
    return [{"job_id": j.id, "array": j.array_job_id} for j in jobs if j.array_job_id is not None]


def _columns(job: SimpleNamespace) -> dict:
    return {k: v for k, v in vars(job).items() if k not in ("tasks", "replicas")}


def _children(job: SimpleNamespace, item: NewJob, task_ids: Iterator[int] | None = None,
              replica_ids: Iterator[int] | None = None) -> None:
    """``job.tasks`` and ``job.replicas`` (with ids when they are given)."""
    spec = item.spec
    job.tasks = [SimpleNamespace(job_id=job.id, position=position, name=task.name,
                                 primary=task.name in spec.primary_tasks, num_nodes=task.num_nodes,
                                 gpus=task.resources.gpus, gpu_type=task.resources.gpu_type,
                                 cpus=task.resources.cpus, memory=task.resources.memory,
                                 grace_period=task.grace_period,
                                 termination_delay=spec.termination_delay.get(task.name, 0.0),
                                 termination_deadline=None, master_port=None, endpoint_port=None)
                 for position, task in enumerate(spec.tasks)]
    job.replicas = [SimpleNamespace(job_id=job.id, task=t.name, task_position=t.position, rank=rank,
                                    state=ReplicaState.PENDING.value, node=None, gpus=[], cpus=0.0, memory=0.0,
                                    pid=None, infra=None, handle=None, attempt=0, ports=None, exit_code=None,
                                    restarts=0, started_at=None, ended_at=None, stop_requested_at=None,
                                    stop_cause=None, kill_at=None, log_path=None, addr=None, ready=False,
                                    restart_at=None, last_exit_code=None)
                    for t in job.tasks for rank in range(t.num_nodes)]
    if task_ids is not None and replica_ids is not None:
        for row, new_id in zip(job.tasks, task_ids):
            row.id = new_id
        for row, new_id in zip(job.replicas, replica_ids):
            row.id = new_id


def _first_event(job: SimpleNamespace, item: NewJob, now: float) -> dict:
    return {"job_id": job.id, "ts": now, "subject": "job", "cause": "submitted", "from_state": None,
            "to_state": JobState.PENDING.value,
            "message": f"submitted by {job.user}: {len(item.spec.tasks)} task(s), {len(job.replicas)} replica(s)"}


_ACTIVE_DOMAINS = select(_JOBS.c.id, _JOBS.c.user, _JOBS.c.name, _JOBS.c.domain).where(
    _JOBS.c.state.not_in(TERMINAL), (_JOBS.c.name.in_(bindparam("names", expanding=True))
                                     | _JOBS.c.domain.in_(bindparam("domains", expanding=True))))


def active_domains(session: Session, names: Iterable[str], domains: Iterable[str] = (),
                   skip: Iterable[int] = ()) -> dict[str, dict[str, str]]:
    """``user -> {domain: name}``: the replica-name domains held by active jobs named any of
    ``names`` or holding any of ``domains`` (those named as a domain may hold another: the
    caller asks for every domain it may give), jobs ``skip`` left out (a batch just inserted)."""
    names, skipped = sorted(set(names)), set(skip)
    rows = session.connection().execute(_ACTIVE_DOMAINS, {"names": names, "domains": sorted(set(domains))})
    out: dict[str, dict[str, str]] = {}
    for job_id, user, name, domain in rows:
        if job_id not in skipped:
            out.setdefault(user, {})[domain or name] = name
    return out


_SET_DOMAIN = update(_JOBS).where(_JOBS.c.id == bindparam("job_id")).values(domain=bindparam("new_domain"))


def set_domains(session: Session, domains: dict[int, str]) -> None:
    """Store the domain of jobs whose replica names are not under their own name."""
    if domains:
        session.connection().execute(_SET_DOMAIN, [{"job_id": k, "new_domain": v} for k, v in domains.items()])


def load_job(session: Session, job_id: int) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id)
                           .options(selectinload(Job.tasks), selectinload(Job.replicas))).first()


def find_job(session: Session, ident: str, user: str | None = None) -> Job | None:
    """A job by id, an array element by ``ARRAYID_INDEX``, or by name (names are per user):
    ``user``'s live job whose replicas' domain it is (``s1`` or ``s1-28``, as ``corral status``
    shows them: one at most), else ``user``'s newest live job of that name, else ``user``'s newest
    of that name or domain whatever its state, else anyone's newest of that name. A live job
    comes before an ended one: ``corral cancel NAME`` is about the one that runs."""
    array, sep, index = ident.partition("_")
    if sep and is_number(array) and is_number(index):
        head, at = parse_id(array), parse_id(index, least=0)
        if head is None or at is None:
            return None
        job_id = session.scalars(select(Job.id).where(Job.array_job_id == head, Job.array_index == at)).first()
        return load_job(session, job_id) if job_id is not None else None
    if is_number(ident):
        job_id = parse_id(ident)
        return load_job(session, job_id) if job_id is not None else None
    name, dot, number = ident.rpartition(".")
    if not NAME_RE.fullmatch(ident) and not (dot and NAME_RE.fullmatch(name) and is_number(number)):
        return None  # no job has that name or domain (``NAME.ID``): do not make the database compare
    job_id = None
    if user is not None:
        live = (Job.user == user, Job.state.not_in(TERMINAL))
        effective = or_(Job.domain == ident, and_(Job.domain.is_(None), Job.name == ident))
        for where in ((*live, effective), (*live, Job.name == ident),
                      (Job.user == user, or_(Job.name == ident, Job.domain == ident))):
            job_id = session.scalars(select(Job.id).where(*where).order_by(Job.id.desc()).limit(1)).first()
            if job_id is not None:
                break
    if job_id is None:
        job_id = session.scalars(select(Job.id).where(Job.name == ident).order_by(Job.id.desc()).limit(1)).first()
    return load_job(session, job_id) if job_id is not None else None


def list_jobs(session: Session, *, include_ended: bool = False, states: Iterable[str] = (),
              user: str | None = None, name: str | None = None, limit: int = 1000, account: str | None = None,
              partition: str | None = None, since: float | None = None, until: float | None = None,
              after: int | None = None, array: int | None = None) -> list[Job]:
    """Jobs in id order. ``since``/``until`` keep those alive at some moment of that window
    (submitted by its end, not ended before its start), as ``sacct -S/-E`` does; ``after`` is
    a cursor: the page of ids above it (else, with ended jobs, the newest ``limit``)."""
    if (name and not NAME_RE.fullmatch(name)) or any(v and len(v) > 64 for v in (user, account, partition)):
        return []  # longer than the column: no job can match, and the database need not be asked
    query = select(Job).options(selectinload(Job.tasks), selectinload(Job.replicas)).order_by(Job.id)
    states = list(states)
    if states:
        query = query.where(Job.state.in_(states))
    elif not include_ended:
        # IN the live states, not NOT IN the ended ones: the (state, id) index then finds the live
        # queue without reading the history
        query = query.where(Job.state.in_([s.value for s in JobState if s.value not in TERMINAL]))
    if user:
        query = query.where(Job.user == user)
    if name:
        query = query.where(Job.name == name)
    if account:
        query = query.where(Job.account == account)
    if partition:
        query = query.where(Job.partition == partition)
    if until is not None:
        query = query.where(Job.submitted_at <= until)
    if since is not None:
        query = query.where((Job.ended_at.is_(None)) | (Job.ended_at >= since))
    if after is not None:
        query = query.where(Job.id > after)
    if array is not None:
        query = query.where(Job.array_job_id == array)
    if include_ended and not states and after is None:
        # newest ended jobs first when the history is long, then back to id order
        return sorted(session.scalars(query.order_by(None).order_by(Job.id.desc()).limit(limit)).all(),
                      key=lambda j: j.id)
    return list(session.scalars(query.limit(limit)).all())


def count_live(session: Session, *, user: str | None = None, account: str | None = None,
               partition: str | None = None) -> tuple[dict[str, int], int]:
    """How many live jobs matching the filters are in each state, and how many of the pending
    are held: one query on the (state, id) index, however long the queue."""
    if any(v and len(v) > 64 for v in (user, account, partition)):
        return {}, 0  # longer than the column: nothing matches
    query = (select(Job.state, func.count(), func.sum(case((Job.hold != "", 1), else_=0)))
             .where(Job.state.in_([s.value for s in JobState if s.value not in TERMINAL])).group_by(Job.state))
    for column, value in ((Job.user, user), (Job.account, account), (Job.partition, partition)):
        if value:
            query = query.where(column == value)
    counts, held = {}, 0
    for state, count, held_here in session.execute(query):
        counts[state] = count
        held += int(held_here or 0)
    return counts, held


def array_members(session: Session, array_job_id: int) -> list[Job]:
    """Every element of the array named by ``array_job_id``, in index order."""
    return list(session.scalars(select(Job).where(Job.array_job_id == array_job_id).order_by(Job.array_index)))


@dataclass(frozen=True)
class Run:
    """A job's last run with what it held at once (a pipeline: its largest stage)."""

    user: str
    account: str
    started_at: float
    ended_at: float | None
    gpus: int
    cpus: float


def runs_between(session: Session, since: float, until: float, *, user: str | None = None,
                 account: str | None = None, partition: str | None = None) -> list[Run]:
    """Jobs whose last run overlaps ``[since, until]`` (still running ones too), read as plain
    columns: an accounting window may span thousands of jobs."""
    per_gpu, per_cpu = Task.gpus * Task.num_nodes, Task.cpus * Task.num_nodes
    sizes = (select(Task.job_id, func.sum(per_gpu).label("gpus"), func.max(per_gpu).label("stage_gpus"),
                    func.sum(per_cpu).label("cpus"), func.max(per_cpu).label("stage_cpus"))
             .group_by(Task.job_id).subquery())
    query = (select(Job.user, Job.account, Job.started_at, Job.ended_at, Job.state,
                    Job.spec["pipeline"].as_boolean().label("pipeline"), sizes.c.gpus, sizes.c.stage_gpus,
                    sizes.c.cpus, sizes.c.stage_cpus)
             .join(sizes, sizes.c.job_id == Job.id)
             .where(Job.started_at.is_not(None), Job.started_at <= until,
                    (Job.ended_at.is_(None)) | (Job.ended_at >= since)))
    for column, value in ((Job.user, user), (Job.account, account), (Job.partition, partition)):
        if value:
            query = query.where(column == value)
    runs = []
    for row in session.execute(query):
        if row.ended_at is None and row.state in TERMINAL:
            continue  # ended before it ever started a run: nothing was held
        pipeline = bool(row.pipeline)
        runs.append(Run(row.user, row.account or row.user, row.started_at, row.ended_at,
                        int((row.stage_gpus if pipeline else row.gpus) or 0),
                        float((row.stage_cpus if pipeline else row.cpus) or 0.0)))
    return runs


def request_cancel(session: Session, job_id: int, now: float, by: str) -> bool:
    """Record the wish to cancel; False when the job has already ended."""
    return bool(request_cancels(session, [job_id], now, by))


def request_cancels(session: Session, job_ids: list[int], now: float, by: str) -> list[int]:
    """Record the wish to cancel each job (a whole array in two statements); the ids of those
    not ended nor being cancelled already."""
    changed: list[int] = []
    jobs = Job.__table__
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start:start + 500]
        changed += session.connection().execute(
            update(jobs).where(jobs.c.id.in_(chunk), jobs.c.state.not_in(TERMINAL), jobs.c.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now, version=jobs.c.version + 1).returning(jobs.c.id)).scalars().all()
    if changed:
        session.connection().execute(_INSERT_EVENT, [
            {"job_id": i, "ts": now, "subject": "job", "cause": "cancel_requested", "from_state": None, "to_state": None,
             "message": f"cancel requested by {by}"} for i in sorted(changed)])
    return sorted(changed)


def set_hold(session: Session, job_id: int, hold: str, now: float, by: str, operator: bool = False) -> bool:
    """Hold a pending job (``hold`` "user" or "admin") or release it (""): False when it is no
    longer pending (it started, ended or is being cancelled meanwhile) or already so."""
    reason = {"user": Reason.HELD_USER.value, "admin": Reason.HELD_ADMIN.value}.get(hold, Reason.NONE.value)
    # an owner's hold never downgrades an operator's (which the owner could then release), and
    # only an operator lifts an operator's hold: checked in the update itself, so no race beats it
    if hold == "user":
        current = Job.hold == ""
    elif hold == "admin":
        current = Job.hold != "admin"
    else:
        current = Job.hold != "" if operator else Job.hold == "user"
    result = session.execute(update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value,
                                               Job.cancel_requested_at.is_(None), current)
                             .values(hold=hold, reason=reason, version=Job.version + 1))
    if result.rowcount:
        add_event(session, job_id, now, "job", "held" if hold else "released",
                  message=f"{'held' if hold else 'released'} by {by}" + (" (operator hold)" if hold == "admin" else ""))
        return True
    return False


def request_requeue(session: Session, job_id: int, now: float, by: str, hold: str = "") -> bool:
    """Record the wish to requeue a starting or running job (and hold it once pending, with
    ``hold`` "user" or "admin"); False when it is in no such state, is being cancelled, or a
    requeue is already under way."""
    values = {"requeue_requested_at": now, "version": Job.version + 1, **({"hold": hold} if hold else {})}
    result = session.execute(update(Job).where(
        Job.id == job_id, Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value]),
        Job.cancel_requested_at.is_(None), Job.requeue_requested_at.is_(None)).values(**values))
    if result.rowcount:
        add_event(session, job_id, now, "job", "requeue_requested",
                  message=f"requeue requested by {by}" + (" (then held)" if hold else ""))
        return True
    return False


def job_events(session: Session, job_id: int) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)).all())


def add_replicas(session: Session, job_id: int, task: str, task_position: int, ranks: list[int]) -> list[int]:
    """New replica rows (PENDING) for a task that grows; returns their ids in rank order."""
    rows = [dict(job_id=job_id, task=task, task_position=task_position, rank=rank, state=ReplicaState.PENDING.value,
                 node=None, gpus=[], cpus=0.0, memory=0.0, infra=None, handle=None, attempt=0, ports=None, exit_code=None, restarts=0,
                 started_at=None, ended_at=None, stop_requested_at=None, stop_cause=None, kill_at=None,
                 log_path=None, addr=None, ready=False, restart_at=None, last_exit_code=None) for rank in ranks]
    return list(session.connection().execute(_INSERT_REPLICAS, rows).scalars().all()) if rows else []


def set_desired_replicas(session: Session, job_id: int, task: str, count: int) -> None:
    """The desired replica count of a task (the control loop reconciles toward it)."""
    session.execute(update(Task).where(Task.job_id == job_id, Task.name == task).values(num_nodes=count))


def set_replica_bounds(session: Session, job_id: int, task: str, low: int, high: int) -> dict:
    """New elastic bounds of a task (``corral scale --min/--max``), kept in the job's stored
    spec where every reader of the task's bounds finds them (the API, the autoscaler, a
    server that restarts); its initial size (what a requeue starts it at) moved inside them.
    Returns the task's spec as stored now."""
    spec = session.execute(select(Job.spec).where(Job.id == job_id)).scalar_one()
    tasks = []
    changed: dict = {}
    for t in spec["tasks"]:
        if t.get("name") == task:
            t = changed = {**t, "min_nodes": low, "max_nodes": high,
                           "num_nodes": min(high, max(low, int(t.get("num_nodes") or 1)))}
        tasks.append(t)
    session.execute(update(Job).where(Job.id == job_id).values(spec={**spec, "tasks": tasks}))
    return changed


def set_fixed_replicas(session: Session, job_id: int, task: str, count: int) -> dict:
    """A new count for a task of a fixed count (``corral scale JOB TASK N``, as ``kubectl
    scale``), kept in the job's stored spec: a requeue or a restarted server starts it at that
    size. Returns the task's spec as stored now."""
    spec = session.execute(select(Job.spec).where(Job.id == job_id)).scalar_one()
    tasks = []
    changed: dict = {}
    for t in spec["tasks"]:
        if t.get("name") == task:
            t = changed = {**t, "num_nodes": count}
            if t.get("min_nodes") is not None:  # equal bounds: the count they pin moves with it
                changed.update(min_nodes=count, max_nodes=count)
        tasks.append(t)
    session.execute(update(Job).where(Job.id == job_id).values(spec={**spec, "tasks": tasks}))
    return changed


def set_priority(session: Session, job_id: int, now: float, by: str, **values: float | int | None) -> bool:
    """Change a pending job's ``priority`` (a fixed value, or None for the formula's) and/or
    ``nice`` (Slurm's ``scontrol update``): False once it is no longer pending."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value,
                                               Job.cancel_requested_at.is_(None))
                             .values(**values, version=Job.version + 1))
    if result.rowcount:
        shown = ", ".join(f"{k} {'formula' if v is None else v}" for k, v in values.items())
        add_event(session, job_id, now, "job", "reprioritized", message=f"{shown} by {by}")
        return True
    return False
