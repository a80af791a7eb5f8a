"""The control loop's in-memory view of the jobs it manages (pending and active), loaded
from the store in bulk and kept current by the loop itself, the only writer of states.
Keeping them in memory means a replica exit or a placement costs no query."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.lifecycle import JobView, ReplicaView, TaskView
from corral.scheduler import Allocation, Dependency, PendingJob, TaskRequest, Topology
from corral.spec.models import STORED, TaskSpec
from corral.states import JobState, ReplicaState, retired
from corral.store.tables import Job, Replica, Task


@dataclass
class TaskRec:
    id: int
    name: str
    primary: bool
    num_nodes: int
    gpus: int
    gpu_type: str | None
    cpus: float
    memory: float
    grace_period: float
    termination_delay: float
    termination_deadline: float | None
    master_port: int | None
    spec: dict  # the task as submitted: setup, run, envs, ports, probes, restart …
    endpoint_port: int | None = None  # where its service endpoint listens (kept across restarts)

    @cached_property
    def service(self) -> TaskSpec:
        """The validated service semantics (probes, restart policy, ports, signals); jobs
        submitted from one file share one validation."""
        return _task_spec(json.dumps(self.spec, sort_keys=True))


@dataclass
class ReplicaRec:
    id: int
    job_id: int
    task: str
    rank: int
    state: ReplicaState
    node: str | None = None
    gpus: tuple[int, ...] = ()
    cpus: float = 0.0
    memory: float = 0.0
    infra: str | None = None  # the executor its current attempt runs on
    handle: dict | None = None  # its current attempt's, opaque (None: not launched)
    exit_code: int | None = None
    restarts: int = 0
    stop_requested_at: float | None = None
    stop_cause: str | None = None
    kill_at: float | None = None
    addr: str | None = None
    ready: bool = False
    restart_at: float | None = None
    last_exit_code: int | None = None
    started_at: float | None = None  # of the current attempt
    attempt: int = 0  # attempts launched so far; the current one's key uses it
    ports: dict | None = None  # name -> port bound on its node
    ended: tuple[str, str] = ("", "")  # why its last end was (cause, words), while the loop remembers
    # the attempt whose stop signal found it already ended (its key; in memory only): its
    # exit, reported after the stop was asked, was its own doing, not the stop's
    ended_before_stop: str | None = None

    @property
    def label(self) -> str:
        return f"{self.task}-{self.rank}"

    @property
    def retired(self) -> bool:
        return retired(self.stop_cause, self.state)

    @property
    def launch_key(self) -> str:
        """The current attempt's key: never reused, so no record of one attempt (its exit
        file, its process) is ever taken for another's."""
        return f"{self.job_id}.{self.task}.{self.rank}.a{self.attempt}"

    def allocation(self) -> Allocation:
        return Allocation(self.task, self.rank, self.node or "", self.gpus, self.cpus, self.memory,
                          tuple(sorted(set((self.ports or {}).values()))))


@dataclass
class JobRec:
    id: int
    name: str
    user: str
    is_group: bool
    state: JobState
    submitted_at: float
    cancel_requested: bool
    force_kill: bool = False  # cancel --force: its stops give no grace period (in memory only)
    tasks: list[TaskRec] = field(default_factory=list)
    replicas: list[ReplicaRec] = field(default_factory=list)
    partition: str = ""
    account: str = ""
    qos: str = ""
    nice: int = 0
    priority: float | None = None
    time_limit: float | None = None
    dependency: tuple[Dependency, ...] = ()
    kill_on_invalid_dep: bool = False
    requeues: int = 0
    started_at: float | None = None
    requeue_requested: bool = False  # stop, then requeue whatever the preempt mode (durable)
    pipeline: bool = False  # stages run one after another, each placed when its turn comes
    hold: str = ""  # "user" or "admin" while held: it waits out of the queue until released
    rank_priority: float = 0.0  # its priority when it was admitted: preemption stops low ones first
    array_job_id: int | None = None  # an array element: its array (the first element's id)
    array_index: int | None = None
    array_throttle: int | None = None  # at most this many elements of the array run at once
    array_extent: tuple[int, ...] | None = None  # the array's (count, min, max, step)
    no_requeue: bool = False  # --no-requeue: a preempted job is cancelled, whatever the preempt mode
    # the engine that provisioned its nodes ended them: (the job's end state, the engine's words)
    ended_by: tuple[JobState, str] | None = None
    world: dict | None = None  # the submit directory, export mode and exported variables (spec.world.World)
    run_as: str | None = None  # the Unix account its replicas run as (None: the server's own)
    # GPU-seconds held in earlier attempts (least attained service; kept in memory only)
    attained_gpu_s: float = 0.0
    yields_to: int = 0  # preempted for this job: it goes first (``PendingJob.yields_to``; in memory)
    # the domain of its replicas' names, ``{task}-{rank}.{domain}``: its name, or ``name-ID`` when
    # a namesake held that at submission (``runtime.discovery.choose_domain``); "" read as the name
    domain: str = ""

    @property
    def names_domain(self) -> str:
        return self.domain or self.name

    def task(self, name: str) -> TaskRec:
        return next(t for t in self.tasks if t.name == name)

    @property
    def members(self) -> list[ReplicaRec]:
        """Replicas that belong to the job now: not those retired by a scale-down."""
        return [r for r in self.replicas if not r.retired]

    def replicas_of(self, task: str) -> list[ReplicaRec]:
        return [r for r in self.members if r.task == task]

    @cached_property
    def request(self) -> PendingJob:
        """What the scheduler sees; fixed while the job waits (``forget_request`` after a
        requeue or a shrink changes it)."""
        tasks = []
        for t in self.stage():
            want = t.service.topology
            topology = None if want is None else Topology(want.level, want.required is not None, want.max_wait)
            options = alternatives_of(t.service)
            first = options[0] if options else (t.gpus, t.cpus, t.memory, t.gpu_type)
            spec = t.service
            tasks.append(TaskRequest(t.name, t.num_nodes, first[0], first[1], first[2], first[3], topology,
                                     options, spec.resources.in_order, spec.constraint,
                                     frozenset(spec.nodelist) if spec.nodelist else None, spec.exclusive,
                                     spec.distinct_nodes, tuple(sorted(set(spec.ports.values()))),
                                     gang=spec.gang_size))
        array = (self.array_job_id, self.array_throttle) if self.array_job_id and self.array_throttle else None
        return PendingJob(self.id, tuple(tasks), self.submitted_at, self.user, self.account, self.time_limit,
                          self.nice, self.partition, self.qos, self.priority, self.dependency, self.name,
                          self.kill_on_invalid_dep, array, attained_gpu_s=self.attained_gpu_s,
                          yields_to=self.yields_to)

    @property
    def preemptible(self) -> bool:
        """Every task declared it checkpoints (``preemptible: true``): stopping it loses no
        task's work beyond its last checkpoint."""
        return bool(self.tasks) and all(t.service.preemptible for t in self.tasks)

    @property
    def restart_cost(self) -> float:
        return max((t.service.restart_cost for t in self.tasks), default=0.0)

    def stage(self) -> list[TaskRec]:
        """The tasks the scheduler places now: all of them, or a pipeline's current stage (its
        first task not yet done)."""
        if not self.pipeline:
            return self.tasks
        for t in self.tasks:
            if not all(r.state == ReplicaState.SUCCEEDED for r in self.replicas_of(t.name)):
                return [t]
        return self.tasks[-1:]

    def forget_request(self) -> None:
        self.__dict__.pop("request", None)

    def time_limit_of(self, task: TaskRec) -> float | None:
        """The shorter of the task's own limit and the job's (which the partition may have set)."""
        limits = [x for x in (task.service.time_limit, self.time_limit) if x is not None]
        return min(limits) if limits else None

    def view(self) -> JobView:
        return JobView(self.id, self.state, self.cancel_requested,
                       tuple(TaskView(t.name, t.primary, t.termination_delay, t.termination_deadline,
                                      (t.spec.get("sbatch") or {}).get("role") == "node")
                             for t in self.tasks),
                       tuple(ReplicaView(r.id, r.task, r.rank, r.state, r.exit_code, r.stop_requested_at is not None,
                                         r.stop_cause == "time_limit", *r.ended) for r in self.members),
                       self.ended_by)


def alternatives_of(spec: TaskSpec) -> tuple[tuple[int, float, float, str | None], ...]:
    """A task's resource alternatives as the scheduler reads them (gpus, cpus, memory, type),
    the one as written first; empty when it names only one."""
    options = spec.resources.alternatives
    if len(options) < 2:
        return ()
    return tuple((a.accelerators[1], a.cpus, a.memory, a.accelerators[0]) for a in options)


@lru_cache(maxsize=4096)
def _task_spec(text: str) -> TaskSpec:
    return TaskSpec.model_validate_json(text, context={STORED: True})


_SCHEDULING = (Job.partition, Job.account, Job.qos, Job.nice, Job.priority, Job.time_limit, Job.dependency,
               Job.kill_on_invalid_dep, Job.requeues, Job.started_at, Job.requeue_requested_at, Job.hold,
               Job.array_job_id, Job.array_index, Job.array_throttle, Job.run_as, Job.attained_gpu_s, Job.domain)


def _scheduling(row) -> dict:
    return {"partition": row.partition or "", "account": row.account or "", "qos": row.qos or "",
            "nice": row.nice or 0, "priority": row.priority, "time_limit": row.time_limit,
            "dependency": tuple(Dependency(kind, tuple(ids)) for kind, ids in (row.dependency or ())),
            "kill_on_invalid_dep": bool(row.kill_on_invalid_dep), "requeues": row.requeues or 0,
            "started_at": row.started_at, "requeue_requested": row.requeue_requested_at is not None,
            "hold": row.hold or "", "array_job_id": row.array_job_id, "array_index": row.array_index,
            "array_throttle": row.array_throttle, "array_extent": tuple(row.spec.get("array_extent") or ()) or None,
            "run_as": getattr(row, "run_as", None), "attained_gpu_s": getattr(row, "attained_gpu_s", None) or 0.0,
            "no_requeue": (row.spec.get("scheduling") or {}).get("requeue") is False,
            "world": row.spec.get("world"), "domain": getattr(row, "domain", None) or ""}


def record_of(job: Job) -> JobRec:
    """The record of a job just created (its tasks and replicas are loaded)."""
    specs = {t["name"]: t for t in job.spec["tasks"]}
    rec = JobRec(job.id, job.name, job.user, job.is_group, JobState(job.state), job.submitted_at,
                 job.cancel_requested_at is not None, **_scheduling(job), pipeline=bool(job.spec.get("pipeline")))
    rec.tasks = [TaskRec(t.id, t.name, t.primary, t.num_nodes, t.gpus, t.gpu_type, t.cpus, t.memory, t.grace_period,
                         t.termination_delay, t.termination_deadline, t.master_port, specs[t.name],
                         getattr(t, "endpoint_port", None)) for t in job.tasks]
    rec.replicas = [ReplicaRec(r.id, r.job_id, r.task, r.rank, ReplicaState(r.state), restarts=r.restarts)
                    for r in job.replicas]
    validated = getattr(job, "validated", None)  # a job the intake just stored: its spec is validated
    if validated is not None:
        tasks = {t.name: t for t in validated.tasks}
        for task in rec.tasks:
            task.__dict__["service"] = tasks[task.name]  # the cached property, filled without a second validation
    return rec


def load_records(session: Session, job_ids: list[int]) -> dict[int, JobRec]:
    """Three queries for any number of jobs."""
    out: dict[int, JobRec] = {}
    specs: dict[int, dict[str, dict]] = {}
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start:start + 500]
        for j in session.execute(select(Job.id, Job.name, Job.user, Job.is_group, Job.state, Job.submitted_at,
                                        Job.cancel_requested_at, Job.spec, *_SCHEDULING).where(Job.id.in_(chunk))):
            specs[j.id] = {t["name"]: t for t in j.spec["tasks"]}
            out[j.id] = JobRec(j.id, j.name, j.user, j.is_group, JobState(j.state), j.submitted_at,
                               j.cancel_requested_at is not None, **_scheduling(j), pipeline=bool(j.spec.get("pipeline")))
        for t in session.scalars(select(Task).where(Task.job_id.in_(chunk)).order_by(Task.job_id, Task.position)):
            out[t.job_id].tasks.append(TaskRec(
                t.id, t.name, t.primary, t.num_nodes, t.gpus, t.gpu_type, t.cpus, t.memory, t.grace_period,
                t.termination_delay, t.termination_deadline, t.master_port, specs[t.job_id][t.name],
                t.endpoint_port))
        for r in session.scalars(select(Replica).where(Replica.job_id.in_(chunk))
                                 .order_by(Replica.job_id, Replica.task_position, Replica.rank)):
            out[r.job_id].replicas.append(ReplicaRec(
                r.id, r.job_id, r.task, r.rank, ReplicaState(r.state), r.node, tuple(r.gpus or ()), r.cpus, r.memory,
                r.infra, r.handle, r.exit_code, r.restarts, r.stop_requested_at, r.stop_cause, r.kill_at,
                r.addr, r.ready, r.restart_at, r.last_exit_code, r.started_at, r.attempt or 0, r.ports))
    return out
