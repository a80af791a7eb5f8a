"""The immutable input of one scheduling cycle: nodes with what is free on them, and the
pending jobs in queue order. Built by the control loop from the store; built by hand (or
by builders) in tests and by the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import product


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int
    cpus: float
    memory: float
    gpu_type: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    free_gpus: frozenset[int] | None = None  # None: all free
    free_cpus: float | None = None
    free_memory: float | None = None
    # the job this node belongs to alone (provisioned for it, e.g. its Slurm allocation)
    dedicated_to: int | None = None
    # Where its replicas listen: replicas of every node with the same address share one port
    # space, so a port held by one is taken for all (Nomad's static ports); None: each replica
    # gets an address of its own (the local executor's), so ports never collide.
    address: str | None = None
    held_ports: tuple[int, ...] = ()  # ports held by replicas running on it (repeats allowed)

    def __post_init__(self) -> None:
        if self.free_gpus is None:
            object.__setattr__(self, "free_gpus", frozenset(range(self.gpus)))
        if self.free_cpus is None:
            object.__setattr__(self, "free_cpus", self.cpus)
        if self.free_memory is None:
            object.__setattr__(self, "free_memory", self.memory)


@dataclass(frozen=True)
class Topology:
    """A task's switch constraint: all replicas under one switch of ``level`` (a label
    key of the policy's topology), ``required`` or only preferred; a required one relaxes
    after ``max_wait`` seconds of waiting (Slurm's ``--switches=1@time``)."""

    level: str
    required: bool = False
    max_wait: float | None = None


@dataclass(frozen=True)
class TaskRequest:
    """Per-replica needs of one task; ``replicas`` of them go in the gang."""

    name: str
    replicas: int
    gpus: int = 0
    cpus: float = 0.1
    memory: float = 0.0
    gpu_type: str | None = None
    topology: Topology | None = None
    # Resource alternatives, (gpus, cpus, memory, gpu_type) each, this request's own first;
    # empty when it has none. ``in_order``: the first that fits wins (else any may).
    alternatives: tuple[tuple[int, float, float, str | None], ...] = ()
    in_order: bool = True
    constraint: str | None = None  # node features (labels) every node of it must have
    nodes: frozenset[str] | None = None  # only these nodes (sbatch --nodelist)
    exclusive: bool = False  # a replica takes a whole idle node
    distinct: bool = False  # no two distinct replicas of the job share a node (sbatch --nodes=N)
    ports: tuple[int, ...] = ()  # declared ports each replica listens on (held on its node's address)
    # replicas come in gangs of this many (ranks 0..g-1, g..2g-1, ...: multi-node service
    # replicas), each gang's members on distinct nodes; different gangs may share a node
    gang: int = 1
    avoid: frozenset[str] = frozenset()  # nodes none of its replicas may use (gang-mates already running)

    def choose(self, index: int) -> TaskRequest:
        """This request with alternative ``index`` as its resources."""
        gpus, cpus, memory, gpu_type = self.alternatives[index]
        return replace(self, gpus=gpus, cpus=cpus, memory=memory, gpu_type=gpu_type)


MAX_VARIANTS = 16  # a job with alternatives on several tasks tries at most this many combinations


@dataclass(frozen=True)
class Dependency:
    """``afterok``/``afternotok``/``afterany`` on job ids, or ``singleton``."""

    kind: str
    job_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PendingJob:
    id: int
    tasks: tuple[TaskRequest, ...]
    submitted_at: float = 0.0
    user: str = ""
    account: str = ""
    time_limit: float | None = None  # seconds; backfill plans with it
    nice: int = 0
    partition: str = ""
    qos: str = ""
    priority: float | None = None  # set by an operator: replaces the computed priority
    dependencies: tuple[Dependency, ...] = ()
    name: str = ""  # for singleton
    kill_on_invalid_dep: bool = False
    array: tuple[int, int] | None = None  # (array id, throttle): at most that many of its elements run at once
    owner: int = 0  # a running job's growth request (id < 0): that job's id
    # its predicted run time (corral.scheduler.durations), at most its time limit; None: none
    expected: float | None = None
    attained_gpu_s: float = 0.0  # GPU-seconds it held in earlier attempts (least attained service)
    # a job requeued by a preemption: the job it made room for, which goes first while it waits
    # (else the victim, older and as high in the queue, takes its room back and is preempted
    # again, over and over)
    yields_to: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(t.replicas * t.gpus for t in self.tasks))
        # what backfill and the job-size factor plan with: the prediction, else the time limit
        object.__setattr__(self, "run_s", self.expected if self.expected is not None else self.time_limit)
        # (account, user): what fair share and limits charge; looked up for every job every cycle
        object.__setattr__(self, "assoc", (self.account or self.user, self.user))

    @property
    def in_order(self) -> bool:
        return all(t.in_order for t in self.tasks)

    def task_named(self, name: str) -> TaskRequest:
        return next(t for t in self.tasks if t.name == name)

    @cached_property
    def variants(self) -> tuple[tuple[tuple[int, ...], PendingJob], ...]:
        """The job once per combination of its tasks' resource alternatives, as (the index
        chosen for each task, the job with those resources), the one as written first; at most
        ``MAX_VARIANTS``. A job without alternatives is its only variant."""
        if not any(t.alternatives for t in self.tasks):
            return ((tuple(0 for _ in self.tasks), self),)
        ranges = [range(len(t.alternatives) or 1) for t in self.tasks]
        out = []
        for choice in product(*ranges):
            if len(out) >= MAX_VARIANTS:
                break
            tasks = tuple(t.choose(i) if t.alternatives else t for t, i in zip(self.tasks, choice))
            out.append((tuple(choice), replace(self, tasks=tasks)))
        return tuple(out)


@dataclass(frozen=True)
class Shrinkable:
    """Replicas of an elastic task that may be removed (highest ranks first) down to its
    minimum, instead of preempting the whole job."""

    task: str
    min_replicas: int
    allocations: tuple  # tuple[Allocation, ...] of the current members, rank order
    # a task that grows on its own (``Growable``): replicas above this count were lent to it
    # while nobody else could use them, so any pending job may take them back (not only one
    # that may preempt it); None: none are lent
    lent_above: int | None = None

    @property
    def lent(self) -> int:
        """How many of its highest ranks are lent (taken back first, by anyone)."""
        if self.lent_above is None:
            return 0
        return max(0, len(self.allocations) - max(self.lent_above, self.min_replicas))


@dataclass(frozen=True)
class Growable:
    """An elastic task that grows on its own into resources nobody else can use
    (``num_nodes: {min, max, grow: true}``, ``corral.scheduler.growth``): it has ``replicas``
    now (all placed), may have ``max_replicas``, and each more replica needs ``request`` (a
    one-replica request: its resources and where it may go). It does not grow before
    ``settled_at`` (it was shrunk for someone else just before)."""

    task: str
    replicas: int
    max_replicas: int
    request: TaskRequest
    settled_at: float = 0.0


@dataclass(frozen=True)
class RunningJob:
    """What backfill, limits and preemption need of a running job: what it holds, when it
    gives it back at the latest (start + time limit), and who it belongs to."""

    id: int
    allocations: tuple  # tuple[Allocation, ...]
    expected_end: float
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    started_at: float = 0.0
    priority: float = 0.0
    ending: bool = False  # already being stopped (preempted, cancelled, done): frees soon
    elastic: tuple[Shrinkable, ...] = ()
    name: str = ""
    array_id: int | None = None  # the job array it is an element of
    no_requeue: bool = False  # its owner said never requeue: a preemption cancels it
    # allocations (among ``allocations``) of replicas already told to stop, an elastic shrink
    # in its grace period: held still, free soon, so preemption counts them as free first
    stopping: tuple = ()
    # when it gives its resources back at the latest (start + time limit), where
    # ``expected_end`` is a predicted end (corral.scheduler.durations); None: expected_end
    limit_end: float | None = None
    # declared checkpointing (a task's ``preemptible: true``, a trace row's checkpoint_s): it
    # may be requeued for shorter work of its own tier (``Policy.las``)
    preemptible: bool = False
    restart_cost_s: float = 0.0  # what a restart costs it (declared or measured)
    attained_gpu_s: float = 0.0  # GPU-seconds held in earlier attempts; this one adds gpus x run
    preempted: int = 0  # times it was preempted so far
    growable: tuple[Growable, ...] = ()  # tasks that grow on its own into idle resources

    @property
    def latest_end(self) -> float:
        return self.expected_end if self.limit_end is None else self.limit_end

    @property
    def gpus(self) -> int:
        return sum(len(a.gpus) for a in self.allocations)

    @property
    def assoc(self) -> tuple[str, str]:
        return (self.account or self.user, self.user)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]  # submit order; policies reorder
    running: tuple[RunningJob, ...] = ()
    usage: dict[tuple[str, str], float] = field(default_factory=dict)  # decayed charge per (account, user)
    gpu_minutes: dict[str, float] = field(default_factory=dict)  # spent, never decayed: "account:X", "qos:Y"
    job_states: dict[int, str] = field(default_factory=dict)  # of jobs that pending jobs depend on
    priorities: dict | None = None  # job id -> Factors computed earlier (a previous plan's); reused
