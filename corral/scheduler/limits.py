"""QOS and account limits, checked for every start so they hold at every instant.

GPUs at once: per user and per account within a QOS (MaxTRESPerUser / MaxTRESPerAccount),
for the whole QOS (GrpTRES), and for an account with its sub-accounts (GrpTRES on the
association). GPU-minute budgets (GrpTRESMins) for a QOS and for an account subtree: a job
may start only if what was spent, plus what running jobs may still spend up to their time
limits, plus its own GPUs times its time limit fit in the budget (a job without a time
limit is charged nothing up front, as Slurm does without the SAFE flag).

A ``Tally`` starts from the running jobs of the snapshot and counts every start the cycle
makes, so the jobs after it see them."""

from __future__ import annotations

from collections import defaultdict

from corral.scheduler.plan import Reason
from corral.scheduler.policy import Policy
from corral.scheduler.snapshot import PendingJob, Snapshot


class Tally:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: float):
        self.policy = policy
        self.parents = {a.name: a.parent for a in policy.accounts}
        self.accounts = {a.name: a for a in policy.accounts}
        self.active = bool(policy.qos or any(a.max_gpus is not None or a.gpu_minutes is not None
                                             for a in policy.accounts))
        self.gpus: dict[tuple, int] = defaultdict(int)
        self.minutes: dict[str, float] = defaultdict(float)
        if not self.active:
            return
        for key, spent in snapshot.gpu_minutes.items():
            kind, _, name = key.partition(":")
            if kind == "account":  # an account's budget covers its sub-accounts
                for owner in self._lineage(name):
                    self.minutes[f"account:{owner}"] += spent
            else:
                self.minutes[key] += spent
        for job in snapshot.running:
            remaining = max(0.0, job.latest_end - now) / 60.0 if job.latest_end != float("inf") else 0.0
            self._count(job.user, job.account or job.user, policy.qos_of(job.qos).name, job.gpus, job.gpus * remaining)

    def _lineage(self, account: str) -> list[str]:
        out, seen = [], set()
        while account and account not in seen:
            seen.add(account)
            out.append(account)
            account = self.parents.get(account) or ""
        return out

    def _count(self, user: str, account: str, qos: str, gpus: int, minutes: float) -> None:
        self.gpus[("qos", qos)] += gpus
        self.gpus[("qos-user", qos, user)] += gpus
        self.gpus[("qos-account", qos, account)] += gpus
        self.minutes[f"qos:{qos}"] += minutes
        for name in self._lineage(account):
            self.gpus[("account", name)] += gpus
            self.minutes[f"account:{name}"] += minutes

    def blocked(self, job: PendingJob) -> Reason | None:
        """The first limit the job would break by starting now, if any."""
        if not self.active or job.gpus == 0:
            return None
        gpus = job.gpus
        minutes = gpus * job.time_limit / 60.0 if job.time_limit is not None else 0.0
        account = job.account or job.user
        qos = self.policy.qos_of(job.qos)
        checks = (
            (qos.max_gpus_per_user, self.gpus[("qos-user", qos.name, job.user)] + gpus, Reason.QOS_USER_GPUS),
            (qos.max_gpus_per_account, self.gpus[("qos-account", qos.name, account)] + gpus, Reason.QOS_ACCOUNT_GPUS),
            (qos.max_gpus, self.gpus[("qos", qos.name)] + gpus, Reason.QOS_GPUS),
            (qos.gpu_minutes, self.minutes[f"qos:{qos.name}"] + minutes, Reason.QOS_GPU_MINUTES),
        )
        for limit, would_be, reason in checks:
            if limit is not None and would_be > limit + 1e-9:
                return reason
        for name in self._lineage(account):
            spec = self.accounts.get(name)
            if spec is None:
                continue
            if spec.max_gpus is not None and self.gpus[("account", name)] + gpus > spec.max_gpus:
                return Reason.ACCOUNT_GPUS
            if spec.gpu_minutes is not None and self.minutes[f"account:{name}"] + minutes > spec.gpu_minutes + 1e-9:
                return Reason.ACCOUNT_GPU_MINUTES
        return None

    def never(self, job: PendingJob) -> bool:
        """True if a limit would block the job even on an idle cluster with nothing spent
        (its GPUs exceed a per-instant cap)."""
        qos = self.policy.qos_of(job.qos)
        caps = [qos.max_gpus_per_user, qos.max_gpus_per_account, qos.max_gpus]
        caps += [self.accounts[n].max_gpus for n in self._lineage(job.account or job.user) if n in self.accounts]
        return any(cap is not None and job.gpus > cap for cap in caps)

    def start(self, job: PendingJob) -> None:
        if self.active:
            minutes = job.gpus * job.time_limit / 60.0 if job.time_limit is not None else 0.0
            self._count(job.user, job.account or job.user, self.policy.qos_of(job.qos).name, job.gpus, minutes)
