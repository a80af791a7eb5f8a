"""What a site decides, as plain frozen data the pure scheduler reads: priority weights,
partitions, QOS, the account tree, topology levels and how far one cycle may go.

``corral.site`` builds this from ``config.yaml``; tests and the simulator build it by hand.

Preemption order. A job J may preempt a running job V only if J's partition has a higher
priority tier than V's, or the tiers are equal and V's QOS is reachable from J's through
the QOS ``preempt`` lists. The QOS lists are checked acyclic when the site is loaded, so
"may preempt" is a strict partial order: two jobs can never preempt each other, whatever
happens to their priorities over time."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Collection, Literal

if TYPE_CHECKING:
    from corral.scheduler.priority import Factors

PreemptMode = Literal["requeue", "cancel", "off"]
Packing = Literal["best_fit", "first_fit"]


@dataclass(frozen=True)
class PriorityWeights:
    """Slurm's PriorityWeight* knobs; every factor is in [0, 1] before weighting."""

    age: float = 1000.0
    fair_share: float = 10000.0
    job_size: float = 1000.0
    partition: float = 1000.0
    qos: float = 1000.0
    max_age_s: float = 7 * 86400.0
    favor_small: bool = False
    # corral's own: the job-size factor is scaled by (1 - age factor), so size orders young
    # jobs and, when job_size <= age, a job at max_age queues by age alone, ahead of every
    # younger job of equal fair share (a young job's age·a + size·s·(1 - a) stays below age
    # while s < 1): a bound on how long a large or long job is passed over. The fade never
    # takes more than age brings in: age + size stay at least what they were when the job
    # was new, so priority never falls as a job waits and no younger twin overtakes it.
    # With job_size above age (corral's default) small jobs thus keep job_size x s - age of
    # their lead, and the bound on being passed over is starve_after_s.
    size_fades: bool = False
    # What "size" means for the job-size factor: "gpus" (Slurm's: GPUs asked / GPUs in the
    # cluster) or "gpu_time" (corral's option: GPUs x time limit, the area the job asks
    # for, on a log scale from one GPU-minute to the whole cluster for size_span_s), which
    # with favor_small orders young jobs shortest-area first, SJF on what users declare.
    size_by: Literal["gpus", "gpu_time"] = "gpus"
    size_span_s: float = 30 * 86400.0
    # After Maui's XFACTOR (off by default, weight 0): how long a job has waited relative to
    # the run time it asked for, min(1, waited / min(time_limit, expansion_cap_s)). Short
    # jobs rise fast, and a gang passed over by a stream of small jobs catches up within its
    # own run time. But in a backlog every old job sits at the ceiling, so a new job queues
    # behind all of them until it has waited its own limit: on philly-pollux it doubled mean
    # JCT (README, "Simulator"), which is why corral's default leaves it out.
    expansion: float = 0.0
    expansion_cap_s: float = 86400.0
    # corral's own (a site knob, 1 by default, as in Slurm): the age factor is
    # (waited / max_age) ** age_power. Above 1 a young job barely ages, so for its first day
    # or so fair share alone orders the users, and a light user's fresh jobs do not queue
    # behind a heavy user's day-old backlog; the factor still reaches 1 at max_age, so the
    # starvation bound stays. The size fade uses the same factor: were it linear, the age
    # gained early (~0) would be less than the size lost, and a job would sink as it waited.
    age_power: float = 1.0
    # After PBS's help_starving_jobs / max_starve, scaled by size: a job is starving once it
    # has waited starve_after_s x (1 - its size), size being the job-size measure in [0, 1]
    # (GPUs, or GPU-time under size_by) before favor_small flips it, and its user holds
    # fewer GPUs than their share of the cluster (``fairshare.entitlements``: the account
    # tree's shares among the users with work). Starving jobs queue ahead of all others in
    # their partition tier, oldest first, so the oldest gets the first reservation and
    # backfill may not delay it: a bound on how long priority can pass a job over, whatever
    # the weights, for every user still short of their share. The larger the job, the more a
    # size factor favouring small ones passes it over, and the sooner it is owed its turn; a
    # flat bound long enough for the smallest jobs leaves the large ones waiting until the
    # trace's end. A user at or above their share gets no such lane (priority alone orders
    # their jobs): otherwise a heavy user's backlog of thousands of day-old jobs would queue
    # first-come-first-served ahead of everyone's fresh work, fair share and size unheard
    # (philly-pollux; README, "Simulator"). inf: never.
    starve_after_s: float = math.inf
    # corral's own: a user at or above their share is owed their turn too, but only after
    # this many times starve_after_s x (1 - size): the lane stays the short-of-share users'
    # first, and still every job has a bound on its wait. inf: no lane for them (as above).
    starve_over_share: float = math.inf


@dataclass(frozen=True)
class Las:
    """Checkpoint-aware preemption for shorter work, after Tiresias' discretised 2D-LAS
    (least attained service); ``corral.scheduler.attained`` applies it. A job's queue is the
    number of ``thresholds_gpu_s`` its attained service (GPU-seconds, every attempt) has
    crossed: a pending job may stop running preemptible jobs of its own partition tier in a
    lower queue (higher number), never one whose QOS outranks its own. Guards: a victim has
    run at least max(``min_run_s``, ``min_run_factor`` x its restart cost) since its last
    start, and is preempted at most ``max_preempted`` times; a pending job that waited over
    ``promote_after`` x its attained run time (GPU-seconds / GPUs) is back in the top queue.
    At most ``max_searches`` blocked jobs look for victims per cycle."""

    thresholds_gpu_s: tuple[float, ...] = (3600.0, 8 * 3600.0)
    min_run_factor: float = 3.0
    min_run_s: float = 600.0
    max_preempted: int = 2
    promote_after: float = 4.0
    # blocked jobs that search for victims per cycle, in queue order (those that could find
    # none are not counted): a backlog of thousands would otherwise each search every cycle
    max_searches: int = 100


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...] = ("*",)  # names or shell-style patterns
    max_time: float | None = None
    default_time: float | None = None
    accounts: tuple[str, ...] | None = None  # None: every account
    priority_tier: int = 0
    job_factor: float = 1.0  # Slurm PriorityJobFactor; normalised across partitions
    preempt_mode: PreemptMode = "requeue"

    def holds(self, node: str) -> bool:
        return any(fnmatch.fnmatchcase(node, pattern) for pattern in self.nodes)


@dataclass(frozen=True)
class Qos:
    name: str
    priority: float = 0.0  # normalised across QOS for the factor
    preempt: tuple[str, ...] = ()  # QOS this one may preempt
    preempt_mode: PreemptMode | None = None  # overrides the partition's for its jobs
    max_gpus_per_user: int | None = None  # MaxTRESPerUser=gres/gpu
    max_gpus_per_account: int | None = None  # MaxTRESPerAccount=gres/gpu
    max_gpus: int | None = None  # GrpTRES=gres/gpu: all jobs of the QOS together
    gpu_minutes: float | None = None  # GrpTRESMins=gres/gpu


@dataclass(frozen=True)
class Account:
    name: str
    parent: str | None = None  # None: under the root
    shares: float = 1.0
    users: tuple[str, ...] = ()
    max_gpus: int | None = None  # GrpTRES=gres/gpu over the account and its sub-accounts
    gpu_minutes: float | None = None  # GrpTRESMins=gres/gpu, same scope


@dataclass(frozen=True)
class Policy:
    name: str = "fifo"
    weights: PriorityWeights = field(default_factory=PriorityWeights)
    backfill: bool = False
    max_reservations: int = 0
    max_backfill_jobs: int = 1000
    max_starts_per_cycle: int = 10_000
    partitions: tuple[Partition, ...] = ()  # empty: one partition of every node
    qos: tuple[Qos, ...] = ()
    accounts: tuple[Account, ...] = ()  # empty: every account an equal share
    topology: tuple[str, ...] = ()  # node label keys, leaf switch first: ("leaf", "spine")
    preemption: bool = True
    # elastic tasks that ask for it (num_nodes grow: true) grow into idle resources
    # (corral.scheduler.growth); a site may turn it off
    grow: bool = True
    max_preemptions_per_cycle: int = 10
    packing: Packing = "best_fit"  # see corral.scheduler.placement
    # plan with run times learned from history (corral.scheduler.durations) instead of the
    # time limits users give; Slurm plans with the limits
    learn_durations: bool = False
    # with learn_durations: a history is trusted only if its runs are within this ratio of
    # each other (``DurationModel.max_spread``); the simulator honours it, the server not yet
    learn_spread: float = math.inf
    # least-attained-service preemption within a tier (``Las``); None: off, as in Slurm
    las: Las | None = None

    @classmethod
    def named(cls, name: str, **overrides) -> Policy:
        """A named policy; keyword arguments (``weights`` too) replace its defaults."""
        if name == "fifo":
            return cls("fifo", **overrides)
        if name == "slurm":
            # cons_tres takes the first nodes in node order that fit (checked against real
            # Slurm by bench/slurm_fidelity.py: the nodes it chose, and the start order)
            return cls("slurm", **{"weights": PriorityWeights(favor_small=False), "backfill": True,
                                   "max_reservations": 100, "max_backfill_jobs": 500, "packing": "first_fit",
                                   **overrides})
        if name == "corral":
            # Shortest declared area first (GPUs x time limit, weighted 10000: SJF on what users
            # declare, for mean JCT), fading as a job ages (age 5000 over 3 days), fair share
            # 10000; and a hard bound on being passed over: a job that waited 1 day x (1 - its
            # size) goes first, oldest first, while its user holds less than their share of the
            # GPUs, so the long and wide jobs that SJF passes over start in time and do not all
            # end last. A reservation for every blocked job examined. age_power and the
            # expansion factor are site knobs: README, "Simulator", says what each won and lost.
            weights = PriorityWeights(favor_small=True, size_fades=True, age=5000.0, max_age_s=3 * 86400.0,
                                      job_size=10000.0, size_by="gpu_time", starve_after_s=86400.0)
            return cls("corral", **{"weights": weights, "backfill": True, "max_reservations": 100,
                                    "max_backfill_jobs": 500, **overrides})
        raise ValueError(f"unknown policy {name!r}; use fifo, slurm or corral")

    def __post_init__(self) -> None:
        # Lookups the scheduler makes per job, built once (policies are immutable).
        object.__setattr__(self, "_partitions", {p.name: p for p in self.partitions})
        object.__setattr__(self, "_qos", {q.name: q for q in self.qos})
        object.__setattr__(self, "max_job_factor", max((p.job_factor for p in self.partitions), default=1.0) or 1.0)
        object.__setattr__(self, "max_qos_priority", max((q.priority for q in self.qos), default=0.0))
        object.__setattr__(self, "_reach", self._reachable())

    def partition(self, name: str) -> Partition:
        return self._partitions.get(name) or self.default_partition

    @property
    def default_partition(self) -> Partition:
        return self.partitions[0] if self.partitions else _ALL

    def queue_key(self, now: float, hungry: Collection[tuple[str, str]] = ()) -> Callable[..., tuple]:
        """The order of a queue at ``now``, as a sort key of (partition, submitted_at, id,
        factors, assoc): higher partition tier first, then starving jobs oldest first (see
        ``starve_after_s``; only the ``hungry`` associations' jobs, those short of their
        share), then higher priority, then earlier submission."""
        tiers = {p.name: p.priority_tier for p in self.partitions}
        default_tier = self.default_partition.priority_tier

        more = self.weights.starve_over_share

        def key(partition: str, submitted_at: float, job_id: int, factors: Factors, assoc: tuple[str, str]) -> tuple:
            # ``owed``, inlined: this runs for every pending job of every cycle
            if assoc in hungry:
                starving = now - submitted_at >= factors.starve_s
            else:
                starving = more != math.inf and now - submitted_at >= factors.starve_s * more
            return (-tiers.get(partition, default_tier), not starving, submitted_at if starving else 0.0,
                    -factors.total, submitted_at, job_id)
        return key

    def owed(self, factors: Factors, waited: float, hungry: bool) -> bool:
        """Whether a job that waited ``waited`` is starving (see ``starve_after_s``): its user
        is ``hungry`` (short of their share), or has waited ``starve_over_share`` times longer."""
        if hungry:
            return factors.starving(waited)
        more = self.weights.starve_over_share
        return more != math.inf and waited >= factors.starve_s * more

    @property
    def preempting(self) -> bool:
        """Whether any job may ever preempt another: preemption on, and more than one
        partition tier or a QOS with a ``preempt`` list."""
        return self.preemption and (len({p.priority_tier for p in self.partitions}) > 1
                                    or any(q.preempt for q in self.qos) or self.las is not None)

    def qos_of(self, name: str) -> Qos:
        return self._qos.get(name) or _NORMAL

    def preempts(self, partition: str, qos: str, victim_partition: str, victim_qos: str) -> bool:
        """The strict partial order of the module docstring."""
        mine, theirs = self.partition(partition).priority_tier, self.partition(victim_partition).priority_tier
        if mine != theirs:
            return mine > theirs
        return victim_qos in self._reach.get(qos, frozenset())

    def _reachable(self) -> dict[str, frozenset[str]]:
        out: dict[str, frozenset[str]] = {}
        for q in self.qos:
            seen: set[str] = set()
            stack = list(q.preempt)
            while stack:
                name = stack.pop()
                if name not in seen:
                    seen.add(name)
                    stack.extend(self._qos[name].preempt if name in self._qos else ())
            out[q.name] = frozenset(seen)
        return out

    def preempt_mode(self, partition: str, qos: str) -> PreemptMode:
        q = self._qos.get(qos)
        return q.preempt_mode if q is not None and q.preempt_mode else self.partition(partition).preempt_mode


_ALL = Partition("all")
_NORMAL = Qos("normal")

