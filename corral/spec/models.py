"""The validated, frozen shape of what users submit: a job of one or more tasks.

Field names follow SkyPilot's task and Job Group YAML so existing files work unchanged;
fields that only make sense on a cloud are accepted and reported as ignored warnings."""

from __future__ import annotations

import difflib
import re
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator,
                      model_validator)

from corral.scheduler.features import parse_constraint
from corral.spec.batchstep import BatchStep
from corral.spec.base import Duration, Strict
from corral.spec.container import TaskConfig
from corral.spec.quantity import parse_duration
from corral.spec.resources import Resources, drop_ignored, warn
from corral.spec.mounts import RemotePath, SourcePath, check_mounts
from corral.spec.source import shown
from corral.spec.recovery import from_job_recovery
from corral.spec.world import World
from corral.spec.service import (Autoscale, Dependency, Endpoint, Ports, Probe, RestartPolicy, Scheduling, SignalName,
                                 TopologyRequest, WarnBeforeTimeout, check_ports, from_skyserve, resolve_port)

# the validation context of a job's spec as stored (bounds moved by `corral scale`), not as submitted
STORED = "stored"

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


NAME_RULE = "letters, digits, '-' and '_', starting with a letter or digit, at most 63 characters"

IGNORED_TASK_FIELDS = frozenset({"volumes", "event_callback"})

DEFAULT_GRACE_S = 10.0

def _env_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise ValueError("an environment value must be a string, a number or a boolean")


EnvMap = dict[str, Annotated[str | None, BeforeValidator(_env_value)]]


_GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]{0,199}")


class GitWorkdir(Strict):
    """SkyPilot's ``workdir: {url, ref}``: the repository is cloned once per job on each node
    its replicas run on (into the job's directory there), ``ref`` (a branch, tag or commit)
    checked out, and ``setup``/``run`` start in it. No shared filesystem is assumed."""

    url: str
    ref: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        value = value.strip()
        if not value or value.startswith("-") or any(c.isspace() or c == "\0" for c in value):
            raise ValueError("a repository URL (https://…, git@host:path, file:///…), without spaces")
        return value

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is not None and (not _GIT_REF.fullmatch(value) or ".." in value):
            raise ValueError(f"{shown(value)} is not a branch, tag or commit name")
        return value


# A directory or a repository, told apart by shape so an error speaks of one of them only (the
# tags, in <>, are left out of the field names errors show).
Workdir = Annotated[Annotated[str, Tag("<path>")] | Annotated[GitWorkdir, Tag("<repository>")],
                    Discriminator(lambda v: "<repository>" if isinstance(v, (dict, GitWorkdir)) else "<path>")]


class TaskSpec(Strict):
    name: str | None = None
    num_nodes: int = Field(default=1, ge=1, le=4096)  # replicas to start with
    # elastic bounds (None: fixed); min 0 lets an autoscaled service scale to zero
    min_nodes: int | None = Field(default=None, ge=0, le=4096)
    max_nodes: int | None = Field(default=None, ge=1, le=4096)
    # num_nodes: {..., grow: true}: grows on its own into GPUs nobody else can use, up to
    # max_nodes; what it grows above its initial count any pending job takes back first
    grow: bool = False
    # replicas come in gangs of this many (a multi-node service replica: SkyServe's num_nodes
    # under service:); each gang has its own rank 0, MASTER_ADDR and readiness (spec/service.py)
    gang_size: int = Field(default=1, ge=1, le=4096)
    resources: Resources = Resources()
    envs: EnvMap = {}
    secrets: EnvMap = {}
    setup: str | None = None
    run: str | None = None
    workdir: Workdir | None = None  # a directory, or a git repository cloned for the job
    # {remote path: file or directory where the job was submitted} (corral/spec/mounts.py)
    file_mounts: dict[RemotePath, SourcePath] = {}
    # service semantics (corral/spec/service.py)
    ports: Ports = {}
    readiness_probe: Probe | None = None
    liveness_probe: Probe | None = None
    depends_on: list[Dependency] = []
    restart: RestartPolicy = RestartPolicy()
    stop_signal: SignalName = "SIGTERM"
    # at most a day: a program that ignores its stop signal holds its GPUs for the whole of it
    grace_period: Annotated[Duration, Field(le=86400.0)] = DEFAULT_GRACE_S
    time_limit: Duration | None = None
    signal_before_timeout: WarnBeforeTimeout | None = None
    # it saves its work (checkpoints) and resumes from it when requeued: a site whose scheduler
    # has ``las`` on may stop it for shorter work of its own tier (docs/scheduling.md);
    # restart_cost: what resuming costs it (loading the checkpoint, warming up)
    preemptible: bool = False
    restart_cost: Duration = 0.0
    # A replica whose readiness probe has not passed this long after it started has failed
    # to start: it gets its stop signal and is restarted (or fails) per its restart policy.
    startup_timeout: Duration = Field(default=600.0, gt=0)
    topology: TopologyRequest | None = None
    endpoint: Endpoint | None = None  # one balanced address over the READY replicas (SkyServe's service)
    autoscale: Autoscale | None = None  # scale with the endpoint's request rate (SkyServe's replica_policy)
    # where replicas may go (corral/spec/batchstep.py): node features, named nodes, whole nodes
    constraint: str | None = None
    nodelist: tuple[str, ...] = ()
    exclusive: bool = False
    distinct_nodes: bool = False
    sbatch: BatchStep | None = None  # set for a Slurm batch script's tasks (corral/spec/sbatch.py)
    config: TaskConfig | None = None  # SkyPilot's per-task config: its docker.run_options (spec/container.py)

    @model_validator(mode="before")
    @classmethod
    def _ignore_cloud_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and data.get("resources") is None and "resources" in data:
            data = {k: v for k, v in data.items() if k != "resources"}
        if isinstance(data, dict) and isinstance(data.get("resources"), dict) and "ports" in data["resources"]:
            # SkyPilot puts ports under resources; corral reads them from there too.
            resources = dict(data["resources"])
            data = {**data, "resources": resources, "ports": data.get("ports", resources.pop("ports"))}
        if isinstance(data, dict) and data.get("pool") is not None:
            # a SkyPilot pool YAML (`sky jobs pool apply`) keeps workers set up for jobs sent to
            # them later; it has no run of its own, so accepting it would run nothing, silently
            raise ValueError("a SkyPilot worker pool (`sky jobs pool apply`) has no counterpart here: corral's queue already hands "
                             "each job the free nodes it asks for. Submit the pool's jobs themselves with corral "
                             "launch (the pool's setup becomes each job's setup; a job array runs many alike)")
        if isinstance(data, dict) and data.get("service") is not None:  # SkyServe
            data = from_skyserve(data, lambda message: warn(info, message))
        if isinstance(data, dict):  # SkyPilot's managed-job recovery
            data = from_job_recovery(data, lambda message: warn(info, message))
        if isinstance(data, dict) and isinstance(data.get("num_nodes"), dict):
            data = {**data, **_elastic(data["num_nodes"])}
        elif isinstance(data, dict) and isinstance(data.get("num_nodes"), str) and not data["num_nodes"].strip().isdigit():
            raise ValueError(f"a whole number of replicas, or {{min: N, max: M}} for an elastic num_nodes; "
                             f"got {shown(data['num_nodes'])}")
        return drop_ignored(data, IGNORED_TASK_FIELDS, "", info)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: dict[str, int]) -> dict[str, int]:
        return check_ports(value)

    @model_validator(mode="after")
    def _container(self, info: ValidationInfo) -> TaskSpec:
        if self.resources.image_id is None:
            if self.config is not None and self.config.docker is not None and self.config.docker.run_options:
                warn(info, "config.docker.run_options is ignored: the task names no container image "
                           "(resources.image_id: docker:IMAGE)")
        return self

    @model_validator(mode="after")
    def _elastic_bounds(self, info: ValidationInfo) -> TaskSpec:
        low = self.num_nodes if self.min_nodes is None else self.min_nodes
        high = self.max_nodes or self.num_nodes
        if not low <= self.num_nodes <= high:
            raise ValueError(f"num_nodes needs min <= initial <= max, got min {low}, initial {self.num_nodes}, "
                             f"max {high}")
        if self.autoscale is not None and self.endpoint is None:
            raise ValueError("autoscale scales with the requests an endpoint forwards: the task needs an endpoint "
                             "(a service)")
        if self.endpoint is not None and self.endpoint.hold is not None and low != 0:
            raise ValueError("endpoint.hold is how long a request waits for a task that can scale to zero; "
                             "this one keeps at least one replica (num_nodes min is not 0)")
        if low == 0 and self.autoscale is None:
            raise ValueError("num_nodes min 0 (scale to zero) needs autoscale: the endpoint's requests are what "
                             "bring a replica back")
        # a stored spec (``STORED``) may have no room left to grow: `corral scale` capped it
        capped = bool(info.context and info.context.get(STORED))
        if self.grow:
            if self.min_nodes is None or self.max_nodes is None or (low == high and not capped):
                raise ValueError(f"grow: a task grows on its own only between an elastic min and max "
                                 f"(num_nodes: {{min: 1, max: 8, grow: true}}); this one is fixed at {self.num_nodes}")
            if self.num_nodes == high and not capped:
                raise ValueError(f"grow: the task starts at its max ({high}); there is nothing to grow into "
                                 f"(give initial below max)")
            if self.autoscale is not None:
                raise ValueError("grow: an autoscaled service's count follows its request rate; it cannot "
                                 "also grow into idle GPUs (drop grow or autoscale)")
            if self.gang_size > 1:
                raise ValueError(f"grow: a task in gangs of {self.gang_size} (gang_size) does not grow on "
                                 f"its own (a replica added alone would be a partial gang)")
        if self.gang_size > 1:
            uneven = [f"{name} {value}" for name, value in (("num_nodes", self.num_nodes), ("min", low),
                                                             ("max", high)) if value % self.gang_size]
            if uneven:
                raise ValueError(f"replicas come in gangs of {self.gang_size} (gang_size): {', '.join(uneven)} "
                                 f"is not a multiple of {self.gang_size}")
        return self

    def gang_of(self, rank: int) -> int:
        """Which gang (multi-node service replica) the replica of this rank belongs to."""
        return rank // self.gang_size

    def heads(self, rank: int) -> bool:
        """The replica of this rank is its gang's rank 0: it serves the port and is probed."""
        return rank % self.gang_size == 0

    def readiness_of(self, rank: int) -> Probe | None:
        """The readiness probe of the replica of ``rank``: a gang's members other than its
        head listen on nothing, so only the head is probed (its readiness is the gang's)."""
        return self.readiness_probe if self.heads(rank) else None

    def liveness_of(self, rank: int) -> Probe | None:
        return self.liveness_probe if self.heads(rank) else None

    @field_validator("endpoint")
    @classmethod
    def _endpoint_port(cls, endpoint: Endpoint | None, info: ValidationInfo) -> Endpoint | None:
        if endpoint is not None:
            resolve_port(endpoint.port, info.data.get("ports") or {})
        return endpoint

    @field_validator("readiness_probe", "liveness_probe")
    @classmethod
    def _probe_port(cls, probe: Probe | None, info: ValidationInfo) -> Probe | None:
        ref = None if probe is None else probe.tcp if probe.tcp is not None else probe.http.port if probe.http else None
        if ref is not None:
            resolve_port(ref, info.data.get("ports") or {})
        return probe

    @field_validator("file_mounts")
    @classmethod
    def _file_mounts(cls, value: dict[str, str]) -> dict[str, str]:
        return check_mounts(value)

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None:
            parse_constraint(value)
        return value

    @field_validator("nodelist", mode="before")
    @classmethod
    def _nodelist(cls, value: Any) -> Any:
        if isinstance(value, str):
            from hostlist import expand_hostlist

            try:
                return tuple(expand_hostlist(value))
            except Exception:  # the library raises its own BadHostlist
                raise ValueError(f"{shown(value)} is not a node list like gpu-[0-3],cpu-1") from None
        return value

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("time_limit must be > 0")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.fullmatch(value):
            raise ValueError(f"a name uses {NAME_RULE}")
        return value

    @field_validator("envs", "secrets")
    @classmethod
    def _env_names(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key in value:
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"{shown(key)} is not a valid environment variable name")
        return value

    @field_validator("setup", "run", mode="before")
    @classmethod
    def _script(cls, value: Any) -> Any:
        if isinstance(value, (bool, int, float, date)):  # run: true, run: 0 … YAML read a command as a value
            written = str(value).lower() if isinstance(value, bool) else str(value)
            kind = "boolean" if isinstance(value, bool) else "date" if isinstance(value, date) else "number"
            raise ValueError(f"YAML reads {written} here as a {kind}, not a command; "
                             f"quote it to run it: '{written}'")
        if isinstance(value, list):  # a list of commands, one per line
            if not all(isinstance(v, str) for v in value):
                raise ValueError("a list of commands must hold only strings")
            return "\n".join(value)
        return value


def _elastic(value: dict[str, Any]) -> dict[str, Any]:
    """``num_nodes: {min: 1, max: 4}`` (starts with ``min``, or ``initial`` when given;
    ``grow: true`` grows it on its own into idle GPUs)."""
    unknown = set(value) - {"min", "max", "initial", "grow"}
    if unknown or "min" not in value or "max" not in value:
        missing = [key for key in ("min", "max") if key not in value]
        raise ValueError("an elastic num_nodes is {min: N, max: M} (optionally initial: K, grow: true)"
                         + (f"; unknown key(s) {sorted(unknown)}" if unknown else "")
                         + "".join(f" ({key!r}: did you mean {close[0]!r}?)" for key in sorted(unknown)
                                   if (close := difflib.get_close_matches(str(key), ["min", "max", "initial", "grow"],
                                                                          n=1, cutoff=0.6)))
                         + (f"; {' and '.join(missing)} missing" if missing else ""))
    grow = value.get("grow", False)
    if not isinstance(grow, bool):
        raise ValueError(f"grow: true or false (grow into idle GPUs on its own), got {grow!r}")
    out = {"num_nodes": value.get("initial", value["min"]), "min_nodes": value["min"], "max_nodes": value["max"]}
    return {**out, "grow": True} if grow else out


def _delays(value: Any) -> float | dict[str, float] | None:
    """``30s`` for every auxiliary, or ``{default: 30s, rollout: 1m}`` per task."""
    if value is None:
        return None
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            try:
                out[str(key)] = parse_duration(item)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return out
    return parse_duration(value)


class GroupHeader(BaseModel):
    """The first document of a job group file."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str | None = None
    execution: Literal["parallel"]
    primary_tasks: list[str] | None = None
    termination_delay: Annotated[float | dict[str, float] | None, BeforeValidator(_delays)] = None
    time_limit: Duration | None = None  # of the whole job; a task's own limit may be shorter

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return TaskSpec._name(value)


class JobSpec(BaseModel):
    """A whole submission, normalised: named tasks, primaries and per-task delays."""

    model_config = ConfigDict(frozen=True)

    name: str
    tasks: tuple[TaskSpec, ...]
    primary_tasks: tuple[str, ...]
    termination_delay: dict[str, float]  # per task name; every task present
    group: bool = False
    # A serial pipeline (SkyPilot's multi-document file without ``execution: parallel``): its
    # tasks are stages run one after another, each placed when its turn comes.
    pipeline: bool = False
    scheduling: Scheduling = Scheduling()
    time_limit: float | None = None  # the job's; filled from the partition when not given
    world: World | None = None  # the submit directory and the submitter's exported environment

    def task(self, name: str) -> TaskSpec:
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(name)

