"""Request and response shapes of the HTTP API. Separate from the ORM tables on purpose:
the wire format is a contract, the tables are an implementation."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field

from corral.spec.world import parse_export
from corral.spec.service import SERVICE_RESTARTS
from corral.states import JobState
from corral.store.tables import Event, Job, Replica, Task


def ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, tz=timezone.utc) if value is not None else None


class TaskOverrides(BaseModel):
    """What ``corral launch --num-nodes/--gpus/--cpus/--memory/--image-id`` puts over a
    single-task file's own fields (validated with the file, as if written in it)."""

    model_config = {"extra": "forbid"}
    num_nodes: int | None = Field(default=None, description="num_nodes")
    accelerators: str | None = Field(default=None, max_length=256, description="resources.accelerators, e.g. H100:8")
    cpus: str | int | float | None = Field(default=None, description="resources.cpus, e.g. 4 or 4+")
    memory: str | int | float | None = Field(default=None, description="resources.memory, e.g. 32 or 32+ (GB)")
    image_id: str | None = Field(default=None, max_length=1024, description="resources.image_id, e.g. docker:IMAGE")


class SubmitRequest(BaseModel):
    yaml: str = Field(description="The task or job-group YAML, as written")
    source: str | None = Field(default=None, description="File name, used in error messages and as default name")
    cwd: str | None = Field(default=None, max_length=4096, description=(
        "The submit directory (absolute): a task without workdir runs there, a relative workdir resolves "
        "against it"))
    base_dir: str | None = Field(default=None, max_length=4096, description="The older name of cwd")
    workdir: str | None = Field(default=None, max_length=4096, description=(
        "Overrides every task's workdir (--workdir); relative to cwd"))
    environment: dict[str, str] = Field(default_factory=dict, description=(
        "The submitter's environment variables (session-only ones left out by the client); which reach "
        "the replicas is the export mode's choice"))
    export: str | None = Field(default=None, max_length=65536, description=(
        "Slurm's --export: ALL (the submitter's environment), NONE, or [ALL,]VAR[,VAR=value...]; "
        "default: the site's (config.yaml environment.export, ALL unless set)"))
    name: str | None = Field(default=None, description="Overrides the job name (--name)")
    env: dict[str, str] = Field(default_factory=dict, description="Overrides task envs (--env K=V)")
    secrets: dict[str, str] = Field(default_factory=dict, description=(
        "Secrets of every task (--secret K=V): set like envs, kept out of envs"))
    scheduling: dict[str, Any] = Field(default_factory=dict, description=(
        "Overrides job-level scheduling fields: partition, account, qos, nice, priority, dependency, "
        "kill_on_invalid_dep, time_limit"))
    array: str | None = Field(default=None, max_length=4096, description=(
        "Submit a job array (Slurm's --array): indices like 0-15, 1,3,5-9:2, with %N to run at most N "
        "elements at once; one job per index"))
    task: TaskOverrides | None = Field(default=None, description=(
        "Overrides of a single-task file's fields (sky launch's --num-nodes, --gpus, --cpus, --memory, --image-id)"))


class SpecIssueOut(BaseModel):
    document: str
    field: str
    line: int | None
    message: str


class ReplicaOut(BaseModel):
    rank: int
    state: str
    ready: bool
    hostname: str
    addr: str | None
    node: str | None
    pid: int | None
    gpus: list[int]
    exit_code: int | None
    last_exit_code: int | None
    restarts: int
    started_at: datetime | None
    ended_at: datetime | None
    log_path: str | None
    reason: str | None = Field(default=None, description=(
        "Why a STARTING replica does not run yet: its container image being pulled (or its container "
        "started) on its node; why a PENDING replica of a running job (its task grew, or it is placed "
        "again) waits for a place, with the scheduler's reason; null otherwise"))


class TaskOut(BaseModel):
    name: str
    primary: bool
    num_nodes: int
    gpus: int
    gpu_type: str | None
    cpus: float
    memory: float
    termination_delay: float
    min_nodes: int | None = Field(default=None, description="An elastic task's fewest replicas (null when fixed)")
    max_nodes: int | None = Field(default=None, description="An elastic task's most replicas (null when fixed)")
    autoscaled: bool = Field(default=False, description=(
        "The task's count follows its endpoint's request rate (within min_nodes..max_nodes)"))
    alternatives: int = Field(default=1, description="How many resource alternatives the task names")
    restart: str | None = Field(default=None, description=(
        "When its replicas restart, in words (\"on failure, at most 3 times\"); null when they never do"))
    endpoint: str | None = Field(default=None, description=(
        "HOST:PORT of the task's service endpoint (balanced over its READY replicas) while the job runs"))
    alternative: int | None = Field(default=None, description=(
        "Which of them it runs on (1-based; gpus, gpu_type, cpus and memory are that one's); null "
        "while it has not started or when it names only one"))
    workdir: str | None = Field(default=None, description=(
        "The directory its replicas start in (a git workdir: the repository's URL); null: its user's home"))
    scale: str | None = Field(default=None, description=(
        "For an elastic task: its bounds and who moves its count within them (the autoscaler, or pinned); "
        "for a service in gangs its service replicas in words; at zero replicas why and what brings one "
        "back; null for a fixed task that is none of these"))
    gang_size: int = Field(default=1, description=(
        "Replicas per service replica: a multi-node service replica is a gang of this many, served by "
        "its rank 0; 1 otherwise"))
    replicas: list[ReplicaOut]


class JobOut(BaseModel):
    id: int
    name: str
    domain: str = Field(default="", description=(
        "Its replicas' names are {task}-{rank}.DOMAIN: its name, or NAME-ID when another active job of its "
        "user held that name's domain at submission (Slurm allows namesakes; host names must be unambiguous)"))
    user: str
    state: str
    reason: str | None = Field(description="why it waits, in Slurm's words (Resources, Priority, Dependency, …); "
                                           "null when nothing holds it back")
    message: str | None
    exit_code: int | None
    group: bool
    gpus: int
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    cancel_requested: bool
    partition: str
    account: str
    qos: str
    nice: int
    time_limit: float | None
    dependency: str | None
    requeues: int
    hold: str = Field(default="", description='"" (not held), "user" (its owner held it) or "admin" (an operator did)')
    expected_start: datetime | None = Field(default=None, description=(
        "A pending job's start as its backfill reservation plans it (squeue --start); null when it "
        "has none (it may start at the next pass, or is too far down the queue to be planned)"))
    predicted_run_s: float | None = Field(default=None, description=(
        "Its run time in seconds as learned from its user's history (the last runs of the same name and "
        "GPU count, else of the same name, …; at most its time limit): a pending job's current prediction, "
        "a started or ended one's prediction when it last started; null without history"))
    array_job_id: int | None = Field(default=None, description="The array this job is an element of (its first element's id)")
    array_index: int | None = Field(default=None, description="This element's index in its array")
    array_throttle: int | None = Field(default=None, description="At most this many of the array's elements run at once")
    cwd: str | None = Field(default=None, description="The directory the job was submitted from")
    export: str | None = Field(default=None, description=(
        "Which of the submitter's variables its replicas start with (Slurm's --export: ALL, NONE or a list; "
        "values given in it are not shown)"))
    exported: int | None = Field(default=None, description="How many of the submitter's variables that carried")
    run_as: str | None = Field(default=None, description=(
        "The Unix account the job's replicas run as (null: the server's own, for jobs stored before accounts)"))
    tasks: list[TaskOut]

    @classmethod
    def of(cls, job: Job, expected_start: float | None = None, down: Mapping[str, str] | None = None,
           predicted: Mapping[int, float] | None = None, waiting: Mapping[int, str] | None = None,
           grow: bool = True) -> JobOut:
        """Built from a stored row without validating it again (``model_construct``): every
        value already has its field's type, and a listing of thousands of jobs (or a flood of
        submissions, each answered with its job) would otherwise validate each one twice.
        ``down``: partitions DOWN now, with why (a job waiting for one shows why); ``predicted``:
        pending jobs' predicted run times (the loop's, as of its last pass); ``waiting``: why a
        running job's replicas wait for a place (replica id -> the scheduler's reason); ``grow``:
        whether the site lets elastic tasks grow on their own (config.yaml scheduler.grow)."""
        by_task: dict[str, list[Replica]] = {}
        for replica in job.replicas:
            by_task.setdefault(replica.task, []).append(replica)
        return cls.model_construct(
            id=job.id, name=job.name, domain=_domain(job), user=job.user, state=job.state,
            reason=_reason(job, down), message=job.message,
            exit_code=job.exit_code, group=job.is_group, gpus=_gpus(job),
            submitted_at=ts(job.submitted_at), started_at=ts(job.started_at), ended_at=ts(job.ended_at),
            cancel_requested=job.cancel_requested_at is not None, partition=job.partition or "",
            account=job.account or "", qos=job.qos or "", nice=job.nice or 0, time_limit=job.time_limit,
            dependency=",".join(kind + "".join(f":{i}" for i in ids) for kind, ids in job.dependency)
                if job.dependency else None, requeues=job.requeues or 0, hold=job.hold or "",
            expected_start=ts(expected_start) if job.state == JobState.PENDING.value else None,
            predicted_run_s=_predicted(job, predicted),
            array_job_id=getattr(job, "array_job_id", None), array_index=getattr(job, "array_index", None),
            array_throttle=getattr(job, "array_throttle", None), **_world(job), run_as=getattr(job, "run_as", None),
            tasks=[_task(job, t, by_task.get(t.name, []), waiting, grow) for t in job.tasks])


def _domain(job: Job) -> str:
    """Its replicas' names' domain: its name unless stored otherwise (a row just inserted, as
    the intake answers it, may not carry the column)."""
    return getattr(job, "domain", None) or job.name


def _predicted(job: Job, predicted: Mapping[int, float] | None) -> float | None:
    """A pending job's current prediction; any other's, the one it last started with."""
    if job.state == JobState.PENDING.value:
        guess = predicted.get(job.id) if predicted else None
    else:
        guess = getattr(job, "predicted_run_s", None)
    return None if guess is None else round(guess, 1)


def _reason(job: Job, down: Mapping[str, str] | None) -> str | None:
    """A pending job's reason (None when nothing holds it back); PartitionDown with why its
    partition is DOWN (kept apart in the loop's view: a sentence is longer than the stored
    reason may be)."""
    if job.reason == "None":
        return None
    why = down.get(job.partition or "") if down and job.reason == "PartitionDown" else None
    return f"PartitionDown ({why})" if why else job.reason


_LIVE = (JobState.STARTING.value, JobState.RUNNING.value)


def _gpus(job: Job) -> int:
    """GPUs the job holds at once: every task's together, or a pipeline's largest stage."""
    per_task = [t.gpus * t.num_nodes for t in job.tasks]
    return max(per_task, default=0) if job.spec.get("pipeline") else sum(per_task)


def _alternative(job: Job, task: Task) -> tuple[int, int | None]:
    """(how many resource alternatives the task names, which one it runs on or None)."""
    spec = next((t for t in job.spec.get("tasks", []) if t.get("name") == task.name), {})
    resources = spec.get("resources") or {}
    options = resources.get("any_of") or resources.get("ordered") or []
    if len(options) < 2:
        return 1, None
    if job.state == JobState.PENDING.value and not job.started_at:
        return len(options), None
    mine = f"{task.gpu_type}:{task.gpus}" if task.gpu_type else task.gpus
    for index, option in enumerate(options):
        if option.get("accelerators") == mine and option.get("cpus") == task.cpus and option.get("memory") == task.memory:
            return len(options), index + 1
    return len(options), None


def _restart_words(policy: dict | None) -> str | None:
    if not policy or policy.get("policy", "never") == "never":
        return None
    codes = policy.get("exit_codes")
    when = "always" if policy["policy"] == "always" else (
        f"on exit codes {', '.join(map(str, codes))}" if codes else "on failure")
    n = policy.get("max_restarts", 3)
    if n >= SERVICE_RESTARTS:
        return f"{when}, for as long as the job runs"
    return f"{when}, at most {n} time{'' if n == 1 else 's'}"


def _world(job: Job) -> dict[str, Any]:
    world = job.spec.get("world")
    if not world:  # submitted before corral kept the submitter's world
        return {"cwd": None, "export": None, "exported": None}
    try:
        export = parse_export(world.get("export") or "ALL").shown
    except ValueError:  # a row written around the API
        export = "?"
    return {"cwd": world.get("cwd"), "export": export, "exported": len(world.get("environment") or {})}


def _scale_words(spec: dict, count: int, grow: bool = True) -> str | None:
    """A task's replicas in words where they are more than a count: an elastic task's bounds
    and who moves it within them, gangs (multi-node service replicas), and a service at zero
    replicas, why and what brings one back."""
    gang = int(spec.get("gang_size") or 1)
    auto = spec.get("autoscale") or {}
    words = []
    low, high = spec.get("min_nodes"), spec.get("max_nodes")
    if low is not None and high is not None:
        within = f"{count} replica(s) within bounds {low}..{high}"
        if auto and low == high:
            within += (f", pinned: the autoscaler holds it at {low} (corral scale --min/--max gives it room "
                       "again)")
        elif auto:
            target = auto.get("target_qps_per_replica")
            within += f", autoscaled at {target:g} request{'' if target == 1 else 's'}/s per service replica"
        elif spec.get("grow") and not grow:
            within += (", asks to grow into idle GPUs but this site has growth off (config.yaml scheduler.grow: "
                       "false): it keeps its count unless scaled")
        elif spec.get("grow"):
            within += (f", grows on its own into idle GPUs (replicas above {spec.get('num_nodes') or 1} are lent: "
                       "given back first when a pending job needs the GPUs)")
        words.append(within)
    if gang > 1:
        words.append(f"{count // gang} service replica(s), each a gang of {gang} replicas served by its rank 0")
    if count == 0 and spec.get("min_nodes") == 0 and auto:
        words.append(f"at zero replicas: no request came for its downscale delay ({auto.get('downscale_delay', 1200):g}s), "
                     "so its GPUs are free; the next request to its endpoint is held and brings one back")
    return "; ".join(words) or None


def _workdir(spec: dict) -> str | None:
    workdir = spec.get("workdir")
    return workdir.get("url") if isinstance(workdir, dict) else workdir


def _task(job: Job, task: Task, replicas: list[Replica], placing: Mapping[int, str] | None = None,
          grow: bool = True) -> TaskOut:
    alternatives, alternative = _alternative(job, task)
    spec = next((t for t in job.spec.get("tasks", []) if t.get("name") == task.name), {})
    # a batch script run in its own container (#SBATCH --container-image) waits for it alike
    script = spec.get("sbatch") or {}
    image = (spec.get("resources") or {}).get("image_id") \
        or ((script.get("container") or {}).get("image") if script.get("role") == "batch" else None)
    # an attempt with a container is STARTING until the engine runs it: nearly always its pull
    waiting = f"pulling image {image.removeprefix('docker:')} (or starting its container)" if image else None
    domain = _domain(job)
    return TaskOut.model_construct(
        name=task.name, primary=task.primary, num_nodes=task.num_nodes, gpus=task.gpus,
        min_nodes=spec.get("min_nodes"), max_nodes=spec.get("max_nodes"), gpu_type=task.gpu_type,
        autoscaled=spec.get("autoscale") is not None,
        cpus=task.cpus, memory=task.memory, termination_delay=task.termination_delay, alternatives=alternatives,
        alternative=alternative, workdir=_workdir(spec), restart=_restart_words(spec.get("restart")),
        endpoint=f"127.0.0.1:{task.endpoint_port}" if task.endpoint_port and job.state in _LIVE else None,
        scale=_scale_words(spec, task.num_nodes, grow) if job.state in _LIVE else None,
        gang_size=int(spec.get("gang_size") or 1),
        replicas=[ReplicaOut.model_construct(
            rank=r.rank, state=r.state, ready=bool(r.ready), hostname=f"{r.task}-{r.rank}.{domain}", addr=r.addr,
            node=r.node, pid=r.pid, gpus=list(r.gpus or []), exit_code=r.exit_code, last_exit_code=r.last_exit_code,
            restarts=r.restarts, started_at=ts(r.started_at), ended_at=ts(r.ended_at), log_path=r.log_path,
            reason=waiting if r.state == "STARTING" else _placing(r, placing, job.state))
            for r in replicas])


def _placing(replica: Replica, placing: Mapping[int, str] | None, state: str) -> str | None:
    if replica.state != "PENDING" or not placing or state not in (JobState.RUNNING.value, JobState.STARTING.value):
        return None
    reason = placing.get(replica.id)
    return f"waiting for a place (reason {reason})" if reason else None


class SubmitResponse(BaseModel):
    job: JobOut
    warnings: list[str]
    array_size: int | None = Field(default=None, description="For a job array: how many elements were queued "
                                                             "(``job`` is the first)")


class QueueOut(BaseModel):
    """The live jobs matching the filters, counted by state: the totals a queue view shows
    beside its first page (``corral queue``, the dashboard)."""

    pending: int
    held: int = Field(description="Of the pending, those held (JobHeldUser, JobHeldAdmin)")
    starting: int
    running: int
    preempted: int
    gpus: int = Field(description="GPUs their replicas hold now")


class EventOut(BaseModel):
    ts: datetime
    subject: str
    from_state: str | None
    to_state: str | None
    cause: str
    message: str | None

    @classmethod
    def of(cls, event: Event, with_message: bool = True) -> EventOut:
        return cls(ts=ts(event.ts), subject=event.subject, from_state=event.from_state, to_state=event.to_state,
                   cause=event.cause, message=event.message if with_message else None)


class NodeOut(BaseModel):
    name: str
    gpus: int
    gpu_type: str | None
    cpus: float
    memory: float
    labels: dict[str, str]
    free_gpus: list[int]
    free_cpus: float
    free_memory: float
    state: str = Field(default="UP", description="UP, or DOWN: its executor lost it (nothing new is placed there)")
    infra: str = Field(default="local", description="where its replicas run: local, ray or slurm")


class PartitionOut(BaseModel):
    name: str
    infra: str | None = Field(description="local, ray, slurm (each job becomes one Slurm job), or null: any")
    slurm_partition: str | None = Field(default=None, description="infra slurm: the Slurm partition its jobs go to")
    nodes: list[str] = Field(description="node name patterns")
    max_time: float | None
    default_time: float | None
    default: bool = Field(description="jobs that name no partition go here")
    state: str = Field(default="UP", description="UP, or DOWN while the engine of its infra does not answer "
                                                 "(its jobs wait with reason PartitionDown)")
    reason: str | None = Field(default=None, description="why it is DOWN")


class ScaleRequest(BaseModel):
    """A task's replica count, its elastic bounds, or both (at least one of them)."""

    task: str
    replicas: int | None = Field(default=None, ge=0, le=4096, description=(
        "The replica count; on an autoscaled task without bounds, it pins both bounds to it"))
    min_nodes: int | None = Field(default=None, ge=0, le=4096, description="New fewest replicas (corral scale --min)")
    max_nodes: int | None = Field(default=None, ge=1, le=4096, description="New most replicas (corral scale --max)")


class PriorityRequest(BaseModel):
    """What ``corral update`` changes on a pending job; a field left out stays as it is."""

    priority: float | None = Field(default=None, ge=0, le=1e12, description=(
        "A fixed priority above the formula (operators); null: back to the formula's"))
    nice: int | None = Field(default=None, ge=-10000, le=10000, description=(
        "Lowers the job's priority by this much; a negative value (raising it) is for operators"))


class CancelResponse(BaseModel):
    id: int
    cancelled: bool
    state: str
    elements: int | None = Field(default=None, description="For a whole job array: how many elements were asked "
                                                           "to stop (those not ended yet)")


class ActionResponse(BaseModel):
    """The answer to hold, release and requeue: whether it changed anything, and the job."""

    id: int
    changed: bool
    state: str
    hold: str
    message: str
    elements: int | None = Field(default=None, description="An array's id: how many of its elements it changed")


class Health(BaseModel):
    status: str
    version: str
    database: str
    pid: int
    nodes: int
    cycles: int
    loop_error: str | None = Field(default=None, description="why the control loop keeps failing (status failing)")
    unreachable: dict[str, str] = Field(default_factory=dict, description=(
        "infras whose engine does not answer, with why: their partitions are DOWN, the rest runs on"))


class ShareOut(BaseModel):
    """One line of ``corral share`` (Slurm's sshare)."""

    account: str
    user: str
    depth: int
    raw_shares: float
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    fair_share: float


class PriorityOut(BaseModel):
    """The factors of one pending job's priority (Slurm's sprio)."""

    id: int
    name: str
    user: str
    account: str
    partition: str
    qos: str
    priority: float
    age: float
    fair_share: float
    job_size: float
    partition_factor: float
    qos_factor: float
    expansion: float
    nice: int
    starving: bool = False  # past the starve limit, its user short of their share: first in line, oldest first
    reason: str


class AllocationOut(BaseModel):
    """What one replica holds now on its node (a row of the dashboard's GPU map)."""

    node: str
    gpus: list[int]
    cpus: float
    memory: float
    job: int
    job_name: str
    user: str
    account: str
    replica: str = Field(description="task-rank, e.g. trainer-0")
    state: str = Field(description="the replica's state (a stopping replica still holds its resources)")


class UsageSeriesOut(BaseModel):
    """One user's or account's use over the window, in the buckets of ``AccountingOut``."""

    key: str
    jobs: int = Field(description="jobs whose run overlaps the window")
    gpu_hours: float
    cpu_hours: float
    gpu_hours_by_bucket: list[float]
    cpu_hours_by_bucket: list[float]


class AccountingOut(BaseModel):
    """GPU- and CPU-hours per user or account over a window, bucketed for a chart: like
    ``corral acct``, a job counts the resources it holds at once times the time its last run
    spent inside the window (running jobs up to now)."""

    since: datetime
    until: datetime
    by: str
    step: float = Field(description="seconds per bucket")
    buckets: list[datetime] = Field(description="each bucket's start: the first is since rounded down to a whole step")
    series: list[UsageSeriesOut] = Field(description="largest GPU-hours first")


class WhoAmI(BaseModel):
    user: str
    role: str = Field(description="admin, operator, user or viewer")
    source: str = Field(description='"local" (the server owner\'s local token) or the client\'s address')
    token: int | None = Field(default=None, description="the id of the token used (null: the local token)")


def _no_nul(value: str) -> str:
    # PostgreSQL's text cannot hold one (the insert fails), and no name or note needs one
    if "\x00" in value:
        raise ValueError("must not hold a NUL byte")
    return value


def _duration(value: Any) -> Any:
    # JSON's true would otherwise pass as the number 1: a token living one second
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a duration: give seconds (a number) or text like 30d, 12h, 1d12h")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]


class TokenRequest(BaseModel):
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$",
                      description="Who the token speaks for (a login name)")
    role: Text | None = Field(default=None, description=(
        "admin, operator, user or viewer; omitted: the role config.yaml gives the user (operators: "
        "operator, everyone else: user)"))
    expires: Annotated[str | float | None, BeforeValidator(_duration)] = Field(default=None, description=(
        "How long it lives: seconds, or 30d, 12h, 1d12h; omitted: until revoked"))
    note: Annotated[str, Field(max_length=200), AfterValidator(_no_nul)] | None = Field(
        default=None, description="What it is for (shown by token list)")


class TokenOut(BaseModel):
    id: int
    user: str
    role: str = Field(description="the role it grants now")
    role_from_config: bool = Field(description="true when the role follows config.yaml (made without one)")
    note: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(BaseModel):
    token: str = Field(description="The token itself: shown this once, stored only as a digest")
    info: TokenOut


class AuditOut(BaseModel):
    id: int
    ts: datetime
    user: str
    role: str
    source: str
    action: str
    target: str | None
    outcome: str = Field(description="ok, refused (a 403) or failed (allowed, but nothing changed)")
    detail: str | None
