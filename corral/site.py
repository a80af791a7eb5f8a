"""The site: everything ``CORRAL_HOME/config.yaml`` declares — the node pool and the
scheduling policy (partitions, the account tree, QOS, priority weights, fair-share
half-life and usage weights, topology levels) — validated into the scheduler's frozen
``Policy``. A bad file is refused with the field and line of every problem, and nothing
starts with it.

    scheduler: {policy: corral, half_life: 7d, usage_weights: {gpu: 1, cpu: 0, memory: 0},
                weights: {age: 5000, fair_share: 10000, job_size: 10000, partition: 1000, qos: 1000,
                          expansion: 0},
                max_age: 3d, age_power: 1, favor_small: true, size_fades: true, size_by: gpu_time,
                expansion_cap: 1d, starve_after: 1d, backfill: {max_reservations: 100, max_jobs: 500},
                packing: best_fit, preemption: true, grow: true,   # packing: best_fit (corral) | first_fit (Slurm's)
                las: {thresholds: [1h, 8h], min_run_factor: 3, min_run: 10m, max_preempted: 2,
                      promote_after: 4, max_searches: 100}}   # preemption for shorter work (off unless given)
    partitions: [{name: batch, nodes: ["gpu-*"], max_time: 1d, default_time: 1h,
                  accounts: [ml], priority_tier: 0, job_factor: 1, preempt_mode: requeue}]
    accounts:   [{name: ml, parent: null, shares: 3, users: [ann], max_gpus: 16, gpu_minutes: 1e6}]
    qos:        [{name: high, priority: 100, preempt: [normal], preempt_mode: requeue,
                  max_gpus_per_user: 8, max_gpus_per_account: 16, max_gpus: 32, gpu_minutes: 1e6}]
    topology:   [leaf, spine]   # node label keys, leaf switch first
    operators:  [ann]           # may set priority / negative nice; default: the server's user
    infra:      {ray: {address: auto, node_prefix: ray}}   # engines beyond this machine (executors.registry)
    retention:  {logs: 30d, checkpoints: 30d, max_log_size: 100MB}   # of ended jobs; off: keep
    api:        {max_streams_per_user: 16}   # followed logs one user may hold open at once
    environment: {export: ALL, drop: [AWS_*]}  # a job's default --export; variables never carried
    identity:   {unix_accounts: {ann: ann_hpc}, service_account: null}   # jobs' Unix accounts (auth.accounts)
    containers: {engine: podman, run_options: [--runtime, runc]}   # the nodes' container engine, its site-wide flags

A partition with ``infra: NAME`` holds that infra's nodes (a Ray cluster's, found at run
time; the nodes Slurm allocates for each of its jobs); each infra's section under ``infra:``
is the schema its plugin declares (``corral.executors.registry``). Partitions without one
hold the nodes their patterns match, of any infra, so one queue and one fair share span
local, Ray and Slurm nodes.

The first partition is the default; a site without ``qos`` has one, ``normal``."""

from __future__ import annotations

import fnmatch
import getpass
import math
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, create_model, field_validator

from corral.auth.accounts import IdentityConfig, server_account
from corral.executors.registry import infras
from corral.pool import NodeEntry, NodeSpec, expand_nodes, local_machine
from corral.scheduler.policy import Account, Las, Partition, Policy, PriorityWeights, Qos
from corral.spec.loader import SpecError, SpecIssue, _dotted, _suggest, find_cycle
from corral.spec.quantity import parse_duration, parse_memory
from corral.spec.source import Document, SourceError, load_documents

from corral.spec.base import Duration, Strict as _Strict


def _duration_or_off(value: object) -> float:
    # YAML reads a bare `off` as false
    if value is False or (isinstance(value, str) and value.strip().lower() in ("off", "never")):
        return math.inf
    return parse_duration(value)


Mode = Literal["requeue", "cancel", "off"]


class Weights(_Strict):
    age: float | None = Field(default=None, ge=0)
    fair_share: float | None = Field(default=None, ge=0)
    job_size: float | None = Field(default=None, ge=0)
    partition: float | None = Field(default=None, ge=0)
    qos: float | None = Field(default=None, ge=0)
    expansion: float | None = Field(default=None, ge=0)


class UsageWeights(_Strict):
    """What one second of a replica charges to fair share (Slurm's TRESBillingWeights)."""

    gpu: float = Field(default=1.0, ge=0)
    cpu: float = Field(default=0.0, ge=0)
    memory: float = Field(default=0.0, ge=0, description="per GB")


class BackfillSettings(_Strict):
    max_reservations: int | None = Field(default=None, ge=0, le=100_000)
    max_jobs: int | None = Field(default=None, ge=1, le=1_000_000)


class LasSettings(_Strict):
    """``scheduler.las``: preemption for shorter work within a tier (``Policy.las``).
    ``thresholds`` are GPU-time (a duration: 1h is one GPU-hour) a job's attained service
    crosses to drop a queue."""

    thresholds: list[Duration] = Field(default=[3600.0, 8 * 3600.0], min_length=1)
    min_run_factor: float = Field(default=3.0, ge=0, allow_inf_nan=False)
    min_run: Duration = 600.0
    max_preempted: int = Field(default=2, ge=0, le=1000)
    promote_after: float = Field(default=4.0, gt=0, allow_inf_nan=False)
    max_searches: int = Field(default=100, ge=1, le=100_000)

    @field_validator("thresholds")
    @classmethod
    def _rising(cls, value: list[float]) -> list[float]:
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError("thresholds must rise strictly, e.g. [1h, 8h]")
        return value


class SchedulerSettings(_Strict):
    policy: Literal["fifo", "slurm", "corral"] = "corral"
    weights: Weights = Weights()
    max_age: Duration | None = None
    age_power: float | None = Field(default=None, ge=1, le=10)  # age factor = (waited / max_age) ** age_power
    favor_small: bool | None = None
    size_fades: bool | None = None
    size_by: Literal["gpus", "gpu_time"] | None = None  # what the job-size factor measures
    expansion_cap: Duration | None = Field(default=None, gt=0)
    # a job pending this long x (1 - its size) queues first (PBS's max_starve); off: never
    starve_after: Annotated[float, BeforeValidator(_duration_or_off)] | None = None
    # a user at or above their share starves after this many times starve_after (default: never)
    starve_over_share: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # plan backfill and job size with run times learned from each user's history
    learn_durations: bool | None = None
    learn_spread: float | None = Field(default=None, ge=1)
    half_life: Duration = 7 * 86400.0
    usage_weights: UsageWeights = UsageWeights()
    backfill: BackfillSettings = BackfillSettings()
    packing: Literal["best_fit", "first_fit"] | None = None  # default: the named policy's
    preemption: bool = True
    # elastic tasks with num_nodes grow: true grow into idle GPUs (off: they never grow on their own)
    grow: bool = True
    # preemption for shorter work within a tier (least attained service); off by default
    las: LasSettings | None = None


class PartitionEntry(_Strict):
    name: str
    infra: str | None = None  # None: nodes of any infra its patterns match
    slurm_partition: str | None = None  # infra slurm: the Slurm partition its jobs go to (default: Slurm's)
    nodes: list[str] = ["*"]
    max_time: Duration | None = None
    default_time: Duration | None = None
    accounts: list[str] | None = None
    priority_tier: int = 0
    job_factor: float = Field(default=1.0, ge=0)
    preempt_mode: Mode = "requeue"

    @field_validator("infra")
    @classmethod
    def _known_infra(cls, value: str | None) -> str | None:
        known = infras()
        if value is not None and value not in known:
            raise ValueError(f"no infra is named {value!r}{_suggest(value, set(known))}; known: {', '.join(known)}")
        return value


class AccountEntry(_Strict):
    name: str
    parent: str | None = None
    shares: float = Field(default=1.0, gt=0)
    users: list[str] = []
    max_gpus: int | None = Field(default=None, ge=0)
    gpu_minutes: float | None = Field(default=None, ge=0)


class QosEntry(_Strict):
    name: str
    priority: float = Field(default=0.0, ge=0)
    preempt: list[str] = []
    preempt_mode: Mode | None = None
    max_gpus_per_user: int | None = Field(default=None, ge=0)
    max_gpus_per_account: int | None = Field(default=None, ge=0)
    max_gpus: int | None = Field(default=None, ge=0)
    gpu_minutes: float | None = Field(default=None, ge=0)




def _infra_config() -> type[BaseModel]:
    """``infra:``: one optional section per known infra, each its plugin's schema."""
    return create_model("InfraConfig", __base__=_Strict,
                        **{name: (i.config | None, None) for name, i in infras().items()})


class RetentionConfig(_Strict):
    """How long the logs and checkpoint directories of ended jobs are kept (``off``: for
    ever), and the size at which a replica's log or the server's is rotated."""

    logs: Annotated[float, BeforeValidator(_duration_or_off)] = 30 * 86400.0
    checkpoints: Annotated[float, BeforeValidator(_duration_or_off)] = 30 * 86400.0
    max_log_size: Annotated[float, BeforeValidator(parse_memory)] = 100 / 1024  # GB


class ApiConfig(_Strict):
    """Limits of the HTTP API: how many long answers (followed logs) one user may hold open at
    once; one more is refused with a 429."""

    max_streams_per_user: int = Field(default=16, ge=1, le=10_000)


class EnvironmentConfig(_Strict):
    """Which environment a replica starts from when its submission does not say (Slurm's
    ``--export``: ALL, NONE or a list), and variables never carried besides the session-only
    ones (``corral.spec.world.SESSION_ONLY``), as names or shell patterns (``AWS_*``)."""

    export: str = "ALL"
    drop: list[str] = []

    @field_validator("export")
    @classmethod
    def _export(cls, value: str) -> str:
        from corral.spec.world import parse_export

        return parse_export(value).text

    @field_validator("drop")
    @classmethod
    def _drop(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or not all(c.isalnum() or c in "_*?[]!" for c in pattern):
                raise ValueError(f"{pattern!r} is not a variable name or pattern (letters, digits, _, * and ?)")
        return value


class ContainersConfig(_Strict):
    """The container engine on the nodes (Podman or Docker, found on each node's PATH) and
    options every container of this site gets (``--runtime runc``, ``--ulimit`` values the
    machines need): the operator's, not a job's, so not limited to a job's allowlist."""

    engine: str = "podman"
    run_options: list[str] = []

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value) or ("/" in value and not value.startswith("/")):
            raise ValueError(f"{value!r} is not a program name or an absolute path (podman, docker)")
        return value

    @field_validator("run_options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("run_options is a list of engine options like [--runtime, runc]")
        return [word for entry in value for word in entry.split()]


InfraConfig = _infra_config()


class SiteConfig(_Strict):
    nodes: list[NodeEntry] | None = None
    infra: InfraConfig = InfraConfig()  # type: ignore[valid-type]
    retention: RetentionConfig = RetentionConfig()
    api: ApiConfig = ApiConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    identity: IdentityConfig = IdentityConfig()
    containers: ContainersConfig = ContainersConfig()
    scheduler: SchedulerSettings = SchedulerSettings()
    partitions: list[PartitionEntry] = []
    accounts: list[AccountEntry] = []
    qos: list[QosEntry] = []
    topology: list[str] = []
    operators: list[str] | None = None


def _server_user() -> tuple[str, ...]:
    return (getpass.getuser(),)


@dataclass(frozen=True)
class Site:
    nodes: list[NodeSpec]
    policy: Policy = field(default_factory=lambda: Policy.named("corral"))
    half_life_s: float = 7 * 86400.0
    usage_weights: UsageWeights = UsageWeights()
    # Who may set a job's fixed ``priority`` or a negative ``nice`` (Slurm: operators and
    # admins only); by default the user the server runs as, the machine's owner.
    operators: tuple[str, ...] = field(default_factory=_server_user)
    # the infras this site uses (local always), each with its validated config.yaml section
    infras: dict[str, Any] = field(default_factory=lambda: {"local": infras()["local"].config()})
    retention: RetentionConfig = RetentionConfig()
    # partitions whose jobs each get nodes provisioned for them alone: partition -> (infra,
    # the engine's own partition or pool, "" for its default)
    provisioned: dict[str, tuple[str, str]] = field(default_factory=dict)
    partition_infra: dict[str, str] = field(default_factory=dict)  # partition -> its declared infra
    api: ApiConfig = ApiConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    identity: IdentityConfig = IdentityConfig()  # which Unix account each user's jobs run as
    containers: ContainersConfig = ContainersConfig()  # the nodes' container engine and its site-wide options

    def account_of(self, user: str) -> str:
        """The account a user charges by default: the first that lists them, else their own."""
        for account in self.policy.accounts:
            if user in account.users:
                return account.name
        return user

    def replay(self, topology: tuple[str, ...], tiers: bool = False) -> tuple[Policy, dict[str, Any]]:
        """The policy and ``simulate`` keywords a trace replay of this site uses (``corral sim
        --config``, ``bench/sim_table.py --variant``). Partitions and QOS only when the trace's
        jobs name them (``tiers``), for their tiers, preempt modes and limits: the replay's
        cluster is not the site's, so a partition spans every node, and the trace's modelled
        time limits stand, not the partition's. Usage decays with the site's half-life and
        charges its accounts."""
        if not tiers:
            return (replace(self.policy, topology=topology, partitions=(), qos=()),
                    {"half_life_s": self.half_life_s, "account_of": self.account_of})
        partitions = tuple(replace(p, nodes=("*",), max_time=None, default_time=None) for p in self.policy.partitions)
        return (replace(self.policy, topology=topology, partitions=partitions),
                {"half_life_s": self.half_life_s, "account_of": self.account_of})

    def default_time(self, partition: str) -> float | None:
        p = self.policy.partition(partition)
        return p.default_time if p.default_time is not None else p.max_time


def load_site(config_path: Path) -> Site:
    if not config_path.exists():
        return _unconfigured()
    source = str(config_path)
    try:
        docs = load_documents(config_path.read_text())
    except SourceError as exc:
        raise SpecError([SpecIssue("config", "", exc.line, exc.message)], source) from None
    if not docs or docs[0].data is None:
        return _unconfigured()
    doc = docs[0]
    if not isinstance(doc.data, dict):
        raise SpecError([SpecIssue("config", "", doc.line, "expected a mapping of sections (nodes, partitions, …)")],
                        source)
    try:
        config = SiteConfig.model_validate(doc.data)
    except ValidationError as exc:
        raise SpecError([SpecIssue("config", _dotted(tuple(e["loc"])), doc.line_of(tuple(e["loc"])),
                                   _message(tuple(e["loc"]), e)) for e in exc.errors()], source) from None
    nodes = expand_nodes(config.nodes, doc, source) if config.nodes else [local_machine()]
    issues = _check(config, nodes, doc)
    if issues:
        raise SpecError(issues, source)
    operators = tuple(config.operators) if config.operators is not None else _server_user()
    used = _used_infras(config)
    if config.nodes is None and any(infras()[n].replaces_pool and infras()[n].replaces_pool(c) for n, c in used.items()):
        nodes = []  # this machine is one of an engine's nodes (inside a Slurm allocation): that is the pool
    provisioned = {p.name: (p.infra, p.slurm_partition or "") for p in config.partitions
                   if p.infra is not None and infras()[p.infra].provisions}
    return Site(nodes, _policy(config), config.scheduler.half_life, config.scheduler.usage_weights, operators,
                used, config.retention, provisioned, {p.name: p.infra for p in config.partitions if p.infra is not None},
                config.api, config.environment, config.identity, config.containers)


def _used_infras(config: SiteConfig) -> dict[str, Any]:
    """Every infra the site uses: those with a section, those a partition names, and those the
    environment implies (a server started inside a Slurm allocation); local always."""
    used: dict[str, Any] = {}
    named = {p.infra for p in config.partitions if p.infra is not None}
    for name, infra in infras().items():
        section = getattr(config.infra, name, None)
        if section is None and infra.implied is not None:
            section = infra.implied()
        if section is None and (name == "local" or name in named):
            section = infra.config()
        if section is not None:
            used[name] = section
    return used


def _unconfigured() -> Site:
    """No config.yaml: this machine, or the nodes of an engine the environment implies (inside
    a Slurm allocation, the allocation's)."""
    used = {"local": infras()["local"].config()}
    for name, infra in infras().items():
        section = infra.implied() if infra.implied is not None else None
        if section is not None:
            used[name] = section
            if infra.replaces_pool is not None and infra.replaces_pool(section):
                return Site([], infras=used)
    return Site([local_machine()], infras=used)


def _policy(config: SiteConfig) -> Policy:
    s = config.scheduler
    base = Policy.named(s.policy)
    w = base.weights
    weights = PriorityWeights(
        age=_pick(s.weights.age, w.age), fair_share=_pick(s.weights.fair_share, w.fair_share),
        job_size=_pick(s.weights.job_size, w.job_size), partition=_pick(s.weights.partition, w.partition),
        qos=_pick(s.weights.qos, w.qos), max_age_s=_pick(s.max_age, w.max_age_s),
        age_power=_pick(s.age_power, w.age_power),
        favor_small=_pick(s.favor_small, w.favor_small), size_fades=_pick(s.size_fades, w.size_fades),
        size_by=_pick(s.size_by, w.size_by),
        expansion=_pick(s.weights.expansion, w.expansion), expansion_cap_s=_pick(s.expansion_cap, w.expansion_cap_s),
        starve_after_s=_pick(s.starve_after, w.starve_after_s),
        starve_over_share=_pick(s.starve_over_share, w.starve_over_share))
    return Policy(
        base.name, weights, base.backfill, _pick(s.backfill.max_reservations, base.max_reservations),
        _pick(s.backfill.max_jobs, base.max_backfill_jobs), base.max_starts_per_cycle,
        partitions=tuple(Partition(p.name, _patterns(p, config), p.max_time, p.default_time,
                                   tuple(p.accounts) if p.accounts is not None else None, p.priority_tier,
                                   p.job_factor, p.preempt_mode) for p in config.partitions),
        qos=tuple(Qos(q.name, q.priority, tuple(q.preempt), q.preempt_mode, q.max_gpus_per_user,
                      q.max_gpus_per_account, q.max_gpus, q.gpu_minutes) for q in config.qos),
        accounts=tuple(Account(a.name, a.parent, a.shares, tuple(a.users), a.max_gpus, a.gpu_minutes)
                       for a in config.accounts),
        topology=tuple(config.topology), preemption=s.preemption, grow=s.grow, packing=_pick(s.packing, base.packing),
        learn_durations=_pick(s.learn_durations, base.learn_durations),
        learn_spread=_pick(s.learn_spread, base.learn_spread),
        las=None if s.las is None else Las(tuple(s.las.thresholds), s.las.min_run_factor, s.las.min_run,
                                           s.las.max_preempted, s.las.promote_after, s.las.max_searches))


def _patterns(p: PartitionEntry, config: SiteConfig) -> tuple[str, ...]:
    """Node name patterns of a partition: as written, or as its infra's plugin maps them (a
    Ray partition's nodes are all named under the cluster's prefix)."""
    infra = infras()[p.infra] if p.infra is not None else None
    if infra is None or infra.partition_nodes is None:
        return tuple(p.nodes)
    section = _used_infras(config).get(p.infra) or infra.config()
    declared = [n.name for n in (expand_nodes(config.nodes, None, "") if config.nodes else [local_machine()])]
    return infra.partition_nodes(section, tuple(p.nodes), declared)


def _pick(value, default):
    return default if value is None else value


def _check(config: SiteConfig, nodes: list[NodeSpec], doc: Document) -> list[SpecIssue]:
    issues: list[SpecIssue] = []

    def issue(loc: tuple, message: str) -> None:
        issues.append(SpecIssue("config", _dotted(loc), doc.line_of(loc), message))

    for section in ("partitions", "accounts", "qos"):
        seen: set[str] = set()
        for i, entry in enumerate(getattr(config, section)):
            if entry.name in seen:
                issue((section, i, "name"), f"{entry.name!r} is declared twice")
            seen.add(entry.name)
    names = [n.name for n in nodes]
    accounts = {a.name for a in config.accounts}
    qos = {q.name for q in config.qos}
    used = _used_infras(config)
    for name, section in used.items():
        check = infras()[name].check
        for loc, message in (check(section, names) if check is not None else []):
            issue(loc, message)
    # nodes join the pool at run time (a Ray cluster's, an allocation's): patterns may match them then
    runtime = any(infras()[n].runtime_nodes is not None and infras()[n].runtime_nodes(c) for n, c in used.items())
    for i, p in enumerate(config.partitions):
        infra = infras()[p.infra] if p.infra is not None else None
        if infra is not None and infra.runtime_nodes is not None and getattr(config.infra, p.infra, None) is None \
                and not infra.provisions and infra.implied is None:
            issue(("partitions", i, "infra"), f"infra {p.infra} needs its section: add infra: {{{p.infra}: {{...}}}}")
        for j, pattern in enumerate(p.nodes):
            if infra is not None and infra.runtime_nodes is not None:
                continue  # its nodes are known only at run time
            if not fnmatch.filter(names, pattern) and not (p.infra is None and runtime):
                issue(("partitions", i, "nodes", j), f"{pattern!r} matches no node of the pool")
        if p.slurm_partition is not None and (infra is None or not infra.provisions):
            issue(("partitions", i, "slurm_partition"), "slurm_partition is for partitions with infra: slurm")
        if p.max_time is not None and p.default_time is not None and p.default_time > p.max_time:
            issue(("partitions", i, "default_time"), "default_time is longer than max_time")
        for j, account in enumerate(p.accounts or []):
            if accounts and account not in accounts:
                issue(("partitions", i, "accounts", j), f"no account is named {account!r}{_suggest(account, accounts)}")
    for i, a in enumerate(config.accounts):
        if a.parent is not None and a.parent not in accounts:
            issue(("accounts", i, "parent"), f"no account is named {a.parent!r}{_suggest(a.parent, accounts)}")
    parents = {a.name: a.parent for a in config.accounts}
    for i, a in enumerate(config.accounts):
        seen, at = set(), a.name
        while at is not None and at in parents:
            if at in seen:
                issue(("accounts", i, "parent"), f"account {a.name!r} is its own ancestor")
                break
            seen.add(at)
            at = parents[at]
    for i, q in enumerate(config.qos):
        for j, other in enumerate(q.preempt):
            if other not in qos:
                issue(("qos", i, "preempt", j), f"no QOS is named {other!r}{_suggest(other, qos)}")
            elif other == q.name:
                issue(("qos", i, "preempt", j), "a QOS cannot preempt itself")
    cycle = find_cycle({q.name: [o for o in q.preempt if o in qos and o != q.name] for q in config.qos})
    if cycle:
        where = next(i for i, q in enumerate(config.qos) if q.name == cycle[0])
        issue(("qos", where, "preempt"), f"QOS preemption has a cycle: {' -> '.join(cycle)} (two jobs could "
                                         "preempt each other forever)")
    service = config.identity.service_account
    if service is not None and service != server_account():
        issue(("identity", "service_account"), f"{service!r} is not this server's account ({server_account()}): "
                                               "a shared service account is the account the server runs as")
    labels = {k for n in nodes for k in n.labels}
    for i, level in enumerate(config.topology):
        if level not in labels and not runtime:  # nodes that join at run time bring their labels
            issue(("topology", i), f"no node has the label {level!r}; label nodes like labels: {{{level}: sw0}}")
    return issues


def _message(loc: tuple, err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden" and loc:
        owner: Any = SiteConfig
        for part in loc[:-1]:
            if isinstance(part, int):
                continue
            fields = getattr(owner, "model_fields", {})
            owner = _model_in(fields[part].annotation) if part in fields else owner
        known = set(getattr(owner, "model_fields", {}))
        return f"unknown field{_suggest(str(loc[-1]), known)}"
    return err["msg"].removeprefix("Value error, ")


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside ``list[X] | None`` and the like."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
