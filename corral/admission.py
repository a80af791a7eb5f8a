"""Admission: what the site decides about a job when it is submitted, before anything is
stored. The job's partition, account and QOS are resolved (defaults filled in) and
checked; its time limit is set from the partition when it gave none; and, like Slurm, a
job that could never run is refused with the field to fix: a partition whose nodes can
never hold the gang, an account the partition does not allow, a QOS or account cap below
the job's GPUs, a dependency on a job that does not exist. Like Slurm's associations, an
account the site's tree declares may be charged only by the users it lists (a ``forbidden``
refusal). Which roles may raise a job's priority is the API's to check (``corral.auth``).

``Admission`` remembers what it admitted by the request's shape (user, whether they may
charge any account, scheduling fields, whether the partition's nodes are provisioned, time limit,
each task's replicas and resources): a flood of submissions asks the same few shapes of a
site that does not change, so only the first of each shape pays for the checks (a pool that
changed, say a Ray node joined, starts the memory afresh).

A partition whose infra does not answer (DOWN: a Ray cluster or Slurm controller that is
unreachable) cannot say what its nodes could hold: its jobs are admitted and wait, as
Slurm queues jobs in a DOWN partition. A refusal whose pool lacks the nodes of an infra that
does not answer says so, rather than blaming the job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from corral.control.records import alternatives_of
from corral.executors.registry import infras
from corral.pool import NodeSpec, node_views
from corral.scheduler import PendingJob, TaskRequest
from corral.scheduler.limits import Tally
from corral.scheduler.placement import why_infeasible
from corral.scheduler.snapshot import Snapshot
from corral.site import Site
from corral.spec.loader import _suggest
from corral.spec.models import JobSpec


@dataclass(frozen=True)
class Admitted:
    partition: str
    account: str
    qos: str
    time_limit: float | None


@dataclass(frozen=True)
class Refusal:
    field: str
    message: str
    forbidden: bool = False  # the job could run, but not charged by this user


Misfit = Callable[[str, list], "str | None"]  # (partition, tasks) -> why its engine can never provision them
# (partition -> why it is DOWN, infra -> why its engine does not answer), as the loop last published them
Outages = tuple[Mapping[str, str], Mapping[str, str]]
_NO_OUTAGES: Outages = ({}, {})


def admit(spec: JobSpec, user: str, site: Site, job_exists: Callable[[int], bool],
          any_account: bool = False, misfit: Misfit | None = None,
          pool: tuple[NodeSpec, ...] | None = None, outages: Outages = _NO_OUTAGES) -> Admitted | Refusal:
    """``any_account``: the submitter may charge any account (an admin, who keeps the tree).
    ``misfit``: asks a provisioned partition's engine whether it could ever hold the job.
    ``outages``: the partitions DOWN and the infras that do not answer, with why."""
    policy, sched = site.policy, spec.scheduling
    partitions = {p.name: p for p in policy.partitions}
    if sched.partition is not None and partitions and sched.partition not in partitions:
        return Refusal("partition", f"no partition is named {sched.partition!r}{_suggest(sched.partition, set(partitions))}"
                                    f"; this site has {', '.join(partitions)}")
    if sched.partition is not None and not partitions and sched.partition != policy.default_partition.name:
        return Refusal("partition", f"this site declares no partitions (config.yaml `partitions:`); drop "
                                    f"partition: {sched.partition}")
    partition = policy.partition(sched.partition or "")
    account = sched.account or site.account_of(user)
    accounts = {a.name for a in policy.accounts}
    if sched.account is not None and accounts and account not in accounts:
        return Refusal("account", f"no account is named {account!r}{_suggest(account, accounts)}")
    if sched.account is not None and not accounts and not any_account and account != site.account_of(user):
        # no account tree: every user charges their own account, and charging another's would
        # spend that user's fair share
        return Refusal("account", f"this site declares no accounts, so {user} charges {user}'s own; "
                                  f"charging {account!r} needs an account tree in config.yaml (accounts: "
                                  "[{name, users}]) or the admin role")
    if partition.accounts is not None and account not in partition.accounts:
        return Refusal("account", f"partition {partition.name!r} accepts accounts {', '.join(partition.accounts)}; "
                                  f"the job charges {account!r} (set account:)")
    if sched.account is not None and accounts and not any_account:
        listed = next(a for a in policy.accounts if a.name == account)
        if user not in listed.users:
            mine = [a.name for a in policy.accounts if user in a.users]
            return Refusal("account", f"account {account!r} does not list {user} among its users (config.yaml "
                                      f"accounts: users), so {user} may not charge it; "
                                      + (f"{user} may charge {', '.join(mine)}" if mine else
                                         f"no account lists {user}: leave account: out to charge {user}'s own"),
                           forbidden=True)
    qos_names = {q.name for q in policy.qos}
    if sched.qos is not None and sched.qos not in (qos_names or {"normal"}):
        return Refusal("qos", f"no QOS is named {sched.qos!r}{_suggest(sched.qos, qos_names)}; this site has "
                              f"{', '.join(sorted(qos_names or {'normal'}))}")
    qos = sched.qos or ("normal" if not qos_names or "normal" in qos_names else sorted(qos_names)[0])
    limit = spec.time_limit if spec.time_limit is not None else site.default_time(partition.name)
    if partition.max_time is not None and limit is not None and limit > partition.max_time:
        return Refusal("time_limit", f"{limit:g}s is longer than partition {partition.name!r} allows "
                                     f"({partition.max_time:g}s)")
    missing = _missing_dependency(sched.dependency, job_exists)
    if missing is not None:
        return missing
    # a pipeline's stages run one at a time: each must fit alone; a job group's tasks, together
    stages = [[t] for t in spec.tasks] if spec.pipeline else [list(spec.tasks)]
    tally = Tally(Snapshot((), ()), policy, 0.0)
    for stage in stages:
        request = PendingJob(0, tuple(TaskRequest(t.name, t.num_nodes, t.resources.gpus, t.resources.cpus,
                                                  t.resources.memory, t.resources.gpu_type,
                                                  alternatives=alternatives_of(t), in_order=t.resources.in_order,
                                                  # what the scheduler will hold it to, so a job that can
                                                  # never be placed is refused now, as sbatch does
                                                  constraint=t.constraint,
                                                  nodes=frozenset(t.nodelist) if t.nodelist else None,
                                                  exclusive=t.exclusive, distinct=t.distinct_nodes,
                                                  ports=tuple(sorted(set(t.ports.values()))),
                                                  gang=t.gang_size)
                                      for t in stage),
                             user=user, account=account, qos=qos, partition=partition.name, time_limit=limit)
        if partition.name in site.provisioned and any(t.sbatch is not None and t.sbatch.het for t in stage):
            # the script would run inside one allocation, where its srun is the engine's own and
            # knows no components of a corral job (see the executor's own refusal at start)
            return Refusal("partition", f"a heterogeneous batch script (#SBATCH hetjob) does not run in partition "
                                        f"{partition.name!r}, whose nodes are allocations of another scheduler: "
                                        "submit it to a partition of corral's own nodes, or to that scheduler")
        if partition.name in site.provisioned:
            # nodes are provisioned for it when it is submitted there: refused now if the engine
            # says none it could give can hold one of its replicas (when it answers; else later)
            why = misfit(partition.name, stage) if misfit is not None else None
            if why is not None:
                return Refusal("resources", f"can never run in partition {partition.name!r}: {why}")
            continue
        # refused only when no alternative can ever run (the reason given is the first one's)
        nodes = pool if pool is not None else tuple(site.nodes)
        reasons = [None] if partition.name in outages[0] else \
            [_infeasible(nodes, partition, variant) for _, variant in request.variants]
        if all(r is not None for r in reasons):
            where = f" in partition {partition.name!r}" if policy.partitions else ""
            hint = ""
            if request.gpus and not any(n.gpus for n in nodes):  # the pool checked (Ray nodes included)
                hint = ("; this site has no GPUs (none was found here and config.yaml declares none): a "
                        "config.yaml in CORRAL_HOME can declare nodes and their GPUs (README: Configuration)")
            if len(reasons) == 1:
                return Refusal("resources", f"can never run{where}: {reasons[0]}{hint}{_missing(site, partition, outages)}")
            each = "; ".join(f"alternative {i + 1}: {r}" for i, r in enumerate(reasons[:4]))
            more = f"; and {len(reasons) - 4} more" if len(reasons) > 4 else ""
            return Refusal("resources", f"can never run{where} with any resource alternative: {each}{more}{hint}"
                                        f"{_missing(site, partition, outages)}")
        if all(tally.never(variant) for _, variant in request.variants):
            return Refusal("qos", f"the job asks for {request.gpus} GPUs at once, more than QOS {qos!r} or account "
                                  f"{account!r} ever allows")
    return Admitted(partition.name, account, qos, limit)


def _joins_pool(site: Site, name: str) -> bool:
    """Whether the infra's nodes join the shared pool at run time (a Ray cluster's; not the nodes
    Slurm provisions for one job each), so a partition of any infra may hold them."""
    infra = infras().get(name)
    return infra is not None and infra.runtime_nodes is not None and name in site.infras \
        and bool(infra.runtime_nodes(site.infras[name]))


def _missing(site: Site, partition, outages: Outages) -> str:  # noqa: ANN001 - a Partition
    """What the pool lacks now because an infra whose nodes the partition may hold does not
    answer (its nodes are not known until it does): the real cause of a refusal."""
    declared = site.partition_infra.get(partition.name)
    gone = [f"infra {infra} does not answer ({why})" for infra, why in sorted(outages[1].items())
            if declared == infra or (declared is None and _joins_pool(site, infra))]
    return f"; but {'; '.join(gone)}, so its nodes are not in the pool now: submit again once it answers" \
        if gone else ""


class Admission:
    """``admit`` for one site, remembering admitted shapes (refusals are rare and name the
    task, so they are worked out each time)."""

    MAX_SHAPES = 1024

    def __init__(self, site: Site, misfit: Misfit | None = None,
                 pool: Callable[[], tuple[NodeSpec, ...] | list[NodeSpec]] | None = None,
                 outages: Callable[[], Outages] | None = None):
        self.site = site
        self.misfit = misfit
        self.outages = outages or (lambda: _NO_OUTAGES)
        # the node pool as the control loop last published it (default: the site's declared one)
        self.pool = pool or (lambda: tuple(site.nodes))
        self._pool: tuple = ()
        self._admitted: dict[tuple, Admitted] = {}

    def __call__(self, spec: JobSpec, user: str, job_exists: Callable[[int], bool],
                 any_account: bool = False) -> Admitted | Refusal:
        site = self.site
        pool = tuple(self.pool())
        if pool != self._pool:  # identical node objects compare at once; a new pool forgets every shape
            self._pool, self._admitted = pool, {}
        sched = spec.scheduling
        # Everything ``admit`` reads besides the dependencies (checked for each job below). The
        # role matters through any_account (an admin may charge accounts that do not list them);
        # a provisioned partition skips the capacity check, so it is keyed too should the site's
        # map change. Priority and nice are the API's role checks, and an array's elements share
        # the one admission of their spec: neither changes the answer.
        name = site.policy.partition(sched.partition or "").name
        provisioned = name in site.provisioned
        outages = self.outages()
        key = (user, any_account, sched.partition, provisioned, name in outages[0], sched.account, sched.qos,
               spec.time_limit, spec.pipeline,
               tuple((t.num_nodes, t.resources, t.gang_size, t.distinct_nodes, t.constraint, t.nodelist and
                      tuple(t.nodelist), t.exclusive) for t in spec.tasks))
        admitted = self._admitted.get(key)
        if admitted is None:
            result = admit(spec, user, site, job_exists, any_account=any_account, misfit=self.misfit, pool=pool,
                           outages=outages)
            if isinstance(result, Admitted):
                if len(self._admitted) >= self.MAX_SHAPES:
                    self._admitted.clear()
                self._admitted[key] = result
            return result
        # every check before the dependencies passed for this shape; the dependencies are this job's own
        return _missing_dependency(sched.dependency, job_exists) or admitted

    def never_holds(self, partition: str, request: PendingJob) -> str | None:
        """Why the nodes of ``partition`` could never hold ``request`` at once, even idle; None
        when they could, or cannot say (a provisioned partition, or one whose infra is down)."""
        site = self.site
        part = site.policy.partition(partition)
        if part.name in site.provisioned or part.name in self.outages()[0]:
            return None
        return _infeasible(tuple(self.pool()), part, request)


def _missing_dependency(dependency: tuple[tuple[str, tuple[int, ...]], ...],
                        job_exists: Callable[[int], bool]) -> Refusal | None:
    for kind, ids in dependency:
        for job_id in ids:
            if not job_exists(job_id):
                return Refusal("dependency", f"{kind}:{job_id}: there is no job {job_id}")
    return None


# Whether a request shape can ever fit a partition's pool, by (pool, partition, shape): a flood
# of submissions asks the same few shapes, and placing each on an idle copy of a large pool
# costs more than everything else admission does. The key holds the node objects themselves,
# by identity, so a pool that changed (a Ray node joined) is a different key.
_FEASIBLE: dict[tuple, tuple] = {}  # key -> the pool (kept alive, so its ids stay its own)


def _infeasible(pool: tuple[NodeSpec, ...], partition, request: PendingJob) -> str | None:  # noqa: ANN001 - a Partition
    key = (tuple(map(id, pool)), partition.name,
           tuple((t.replicas, t.gpus, t.cpus, t.memory, t.gpu_type, t.gang, t.distinct, t.constraint, t.nodes,
                  t.exclusive) for t in request.tasks))
    if key in _FEASIBLE:
        return None
    reason = why_infeasible(node_views([n for n in pool if partition.holds(n.name)]), request)
    if reason is None:
        if len(_FEASIBLE) >= 256:
            _FEASIBLE.clear()
        _FEASIBLE[key] = pool
    return reason

