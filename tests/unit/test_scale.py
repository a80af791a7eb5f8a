"""The scheduler at scale: its indexes (per-GPU-type buckets, leaf-switch rooms, walks over a
few named nodes) decide exactly what the straightforward walk decides, in random worlds with
partitions, QOS and account limits, gangs, topology, reservations and preemption; and at
thousands of nodes and jobs a plan never overcommits a GPU, starts gangs all or nothing, and
keeps every limit (hypothesis, few examples: each is a large world)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node
from reference_scheduler import straightforward
from corral.scheduler import (Account, NodeView, Partition, PendingJob, Plan, Policy, Qos, RunningJob, Snapshot,
                              TaskRequest, Topology, schedule)
from corral.scheduler import placement
from corral.scheduler.placement import FreePool, place_gang

PARTITIONS = (Partition("batch", nodes=("b-*",), max_time=7200.0),
              Partition("urgent", nodes=("b-*",), priority_tier=10),
              Partition("debug", nodes=("d-*",), job_factor=4.0))
QOS = (Qos("normal"), Qos("high", priority=100, preempt=("normal", "low")),
       Qos("low", max_gpus_per_user=12, preempt_mode="cancel"), Qos("capped", max_gpus=20, gpu_minutes=4000.0))
ACCOUNTS = (Account("ml", shares=3, users=("ann", "bob")), Account("vision", parent="ml"),
            Account("physics", max_gpus=24, gpu_minutes=30000.0))
USERS = (("ann", "ml"), ("bob", "vision"), ("cy", "physics"), ("dee", "physics"))


def site(name: str, **overrides) -> Policy:
    return Policy.named(name, partitions=PARTITIONS, qos=QOS, accounts=ACCOUNTS, **overrides)


@st.composite
def requests(draw, names: list[str]) -> TaskRequest:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    topo = draw(st.one_of(st.none(), st.builds(Topology, st.sampled_from(["leaf", "spine"]), st.booleans(),
                                               st.sampled_from([None, 0.0, 600.0]))))
    return TaskRequest(draw(st.sampled_from(["main", "aux"])), draw(st.integers(1, 4)), gpus,
                       draw(st.sampled_from([0.1, 1.0, 8.0])), draw(st.sampled_from([0.0, 64.0])),
                       draw(st.sampled_from([None, None, "H100", "a100"])), topo,
                       nodes=frozenset(draw(st.lists(st.sampled_from(names), min_size=1, max_size=6)))
                       if draw(st.integers(0, 9)) == 0 else None,
                       exclusive=draw(st.integers(0, 19)) == 0, distinct=draw(st.integers(0, 4)) == 0)


@st.composite
def worlds(draw, max_nodes: int = 24, max_running: int = 24, max_pending: int = 30):
    """(snapshot, policy, now, full): nodes under leaf and spine switches in two partitions'
    name spaces (b-*, d-*), two GPU types, some busy with running jobs of several tiers and
    QOS (some already ending), and a queue of gangs with topology, node lists, exclusive and
    distinct replicas, time limits and QOS; a site policy (fifo, slurm or corral), topology on
    or off, best or first fit, a main-scheduler pass or a full one."""
    per_leaf = draw(st.sampled_from([1, 2, 4]))
    views = []
    for i in range(draw(st.integers(1, max_nodes))):
        base = node(f"{'d' if i % 5 == 4 else 'b'}-{i}", gpus=draw(st.sampled_from([0, 4, 8, 8])), cpus=32.0,
                    memory=256.0, gpu_type=draw(st.sampled_from(["H100", "H100", "A100"])))
        views.append(replace(base, labels=(("leaf", f"l{i // per_leaf}"), ("spine", f"s{i // (2 * per_leaf)}"))))
    names = [v.name for v in views]
    pool = FreePool(views)
    running = []
    for job_id in range(1000, 1000 + draw(st.integers(0, max_running))):
        user, account = draw(st.sampled_from(USERS))
        job = PendingJob(job_id, (TaskRequest("t", draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4, 8])),
                                              1.0),))
        allocs = place_gang(pool, job)
        if allocs is None:
            continue
        running.append(RunningJob(job_id, allocs, float(draw(st.integers(60, 20000))), user, account,
                                  draw(st.sampled_from(["batch", "debug"])), draw(st.sampled_from(["normal", "low"])),
                                  0.0, float(draw(st.integers(0, 5))), ending=draw(st.integers(0, 9)) == 0))
    pending = []
    for job_id in range(1, draw(st.integers(1, max_pending)) + 1):
        tasks = tuple({t.name: t for t in draw(st.lists(requests(names), min_size=1, max_size=2))}.values())
        user, account = draw(st.sampled_from(USERS))
        pending.append(PendingJob(job_id, tasks, float(draw(st.integers(0, 3600))), user, account,
                                  draw(st.sampled_from([None, 600.0, 3600.0, 30000.0])), 0,
                                  draw(st.sampled_from(["batch", "batch", "urgent", "debug"])),
                                  draw(st.sampled_from(["normal", "normal", "high", "low", "capped"]))))
    policy = site(draw(st.sampled_from(["fifo", "slurm", "corral"])),
                  topology=draw(st.sampled_from([(), ("leaf",), ("leaf", "spine")])),
                  packing=draw(st.sampled_from(["best_fit", "first_fit"])),
                  max_reservations=draw(st.sampled_from([0, 3, 100])), max_backfill_jobs=draw(st.sampled_from([5, 500])))
    if policy.name == "fifo":
        policy = replace(policy, max_reservations=0)
    usage = {(a, u): float(draw(st.integers(0, 1000))) for u, a in USERS}
    spent = {"qos:capped": float(draw(st.integers(0, 3000))), "account:physics": float(draw(st.integers(0, 20000)))}
    snapshot = Snapshot(pool.views(), tuple(pending), tuple(running), usage, spent)
    return snapshot, policy, float(draw(st.integers(3600, 7200))), draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(worlds(), st.sampled_from([1, placement.SUBSET]))
def test_the_indexes_decide_what_the_straightforward_walk_decides(world, subset: int) -> None:
    snapshot, policy, now, full = world
    with straightforward():
        expected = schedule(snapshot, now, policy, full)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(placement, "SUBSET", subset)  # 1: every replica confined to named nodes walks only those
        assert schedule(snapshot, now, policy, full) == expected


def large_world(seed: int, nodes: int, pending: int, running_share: float) -> Snapshot:
    """A seeded world of ``nodes`` 8-GPU nodes (two types; 8 per leaf, 4 leaves per spine;
    every fifth node in the debug partition), ``running_share`` of them busy with running
    jobs of every user and QOS, and ``pending`` jobs: 1-64 GPUs, multi-node above 8, some job
    groups with a CPU-only task, some with a switch constraint, a node list or distinct nodes."""
    import random

    rng = random.Random(seed)
    views = [NodeView(f"{'d' if i % 5 == 4 else 'b'}-{i:05d}", 8, 64.0, 512.0, "A100" if i % 7 == 6 else "H100",
                      (("leaf", f"l{i // 8}"), ("spine", f"s{i // 32}"))) for i in range(nodes)]
    names = [v.name for v in views]
    pool = FreePool(views)
    running, job_id = [], 10_000_000
    while pool.free_gpus > nodes * 8 * (1 - running_share):
        user, account = rng.choice(USERS)
        allocs = place_gang(pool, PendingJob(job_id, (TaskRequest("t", 1, rng.choice([1, 2, 4, 8]), 1.0),)))
        if allocs is None:
            break
        running.append(RunningJob(job_id, allocs, rng.uniform(60, 86400), user, account,
                                  rng.choice(["batch", "debug"]), rng.choice(["normal", "low", "capped"]),
                                  0.0, rng.random(), ending=rng.random() < 0.02))
        job_id += 1
    jobs = []
    for i in range(pending):
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64])
        topo = Topology(rng.choice(["leaf", "spine"]), rng.random() < 0.5, rng.choice([None, 600.0])) \
            if gpus > 8 and rng.random() < 0.3 else None
        main = TaskRequest("main", max(1, gpus // 8), min(gpus, 8), 1.0, 0.0, rng.choice([None, None, "H100", "a100"]),
                           topo, distinct=rng.random() < 0.05,
                           nodes=frozenset(rng.sample(names, min(len(names), 16))) if rng.random() < 0.02 else None)
        tasks = (main, TaskRequest("reward", 1, 0, 1.0)) if rng.random() < 0.1 else (main,)
        user, account = rng.choice(USERS)
        jobs.append(PendingJob(i, tasks, float(i % 3600), user, account, rng.choice([None, 600.0, 3600.0, 86400.0]),
                               0, rng.choice(["batch", "batch", "urgent", "debug"]),
                               rng.choice(["normal", "normal", "high", "low", "capped"])))
    usage = {(a, u): float(rng.randint(0, 1000)) for u, a in USERS}
    return Snapshot(pool.views(), tuple(jobs), tuple(running), usage, {"qos:capped": 100.0,
                                                                        "account:physics": 1000.0})


def check(snapshot: Snapshot, plan: Plan, policy: Policy, now: float) -> None:
    """Never overcommit, gangs all-or-none, every QOS and account limit holds, every pending
    job started or has a reason."""
    views = {v.name: v for v in snapshot.nodes}
    used: dict[str, set[int]] = defaultdict(set)
    cpus: dict[str, float] = defaultdict(float)
    jobs = {j.id: j for j in snapshot.pending}
    parents = {a.name: a.parent for a in policy.accounts}

    def keys(user: str, account: str, qos_name: str) -> list[tuple]:
        qos = policy.qos_of(qos_name)
        out = [("qos", qos.name), ("qos-user", qos.name, user), ("qos-account", qos.name, account)]
        while account:
            out.append(("account", account))
            account = parents.get(account) or ""
        return out

    gpus: dict[tuple, float] = defaultdict(float)
    minutes: dict[tuple, float] = defaultdict(float)
    for key, spent in snapshot.gpu_minutes.items():
        kind, _, name = key.partition(":")
        minutes[(kind, name)] += spent  # (no sub-account spends in these worlds)
    for r in snapshot.running:
        remaining = max(0.0, r.latest_end - now) / 60.0
        for key in keys(r.user, r.account, r.qos):
            gpus[key] += r.gpus
            minutes[key] += r.gpus * remaining
    touched: set[tuple] = set()
    for start in plan.starts:
        job = jobs[start.job_id]
        want = sorted((t.name, rank) for t in job.tasks for rank in range(t.replicas))
        assert sorted((a.task, a.rank) for a in start.allocations) == want, "a gang started in part"
        for task in job.tasks:
            on = [a.node for a in start.allocations if a.task == task.name]
            if task.distinct:
                assert len(set(on)) == len(on)
            if task.nodes is not None:
                assert set(on) <= task.nodes
        for a in start.allocations:
            assert set(a.gpus) <= views[a.node].free_gpus, f"GPU not free on {a.node}"
            assert not used[a.node] & set(a.gpus), f"a GPU of {a.node} given twice"
            used[a.node] |= set(a.gpus)
            cpus[a.node] += a.cpus
            assert cpus[a.node] <= views[a.node].free_cpus + 1e-6
        if job.gpus:
            for key in keys(job.user, job.account, job.qos):
                gpus[key] += job.gpus
                minutes[key] += job.gpus * job.time_limit / 60.0 if job.time_limit is not None else 0.0
                touched.add(key)
    # a start is checked against the tally with everything before it: each limit a start
    # counted towards holds at the end of the cycle (running work alone may exceed it)
    accounts = {a.name: a for a in policy.accounts}
    for key in touched:
        if key[0] == "account":
            spec = accounts.get(key[1])
            limit, budget = (spec.max_gpus, spec.gpu_minutes) if spec else (None, None)
        else:
            qos = policy.qos_of(key[1])
            limit = {"qos": qos.max_gpus, "qos-user": qos.max_gpus_per_user,
                     "qos-account": qos.max_gpus_per_account}[key[0]]
            budget = qos.gpu_minutes if key[0] == "qos" else None
        assert limit is None or gpus[key] <= limit, f"{key}: {gpus[key]} GPUs over {limit}"
        assert budget is None or minutes[key] <= budget + 1e-6, f"{key}: {minutes[key]} GPU-minutes over {budget}"
    started = plan.started_ids()
    assert started | set(plan.reasons) == set(jobs) and not started & set(plan.reasons)


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.3, 0.6, 0.9]), st.booleans())
def test_corral_at_1000_nodes_and_5000_jobs(seed: int, busy: float, full: bool) -> None:
    snapshot = large_world(seed, 1000, 5000, busy)
    policy, now = site("corral", topology=("leaf", "spine")), 3600.0
    check(snapshot, schedule(snapshot, now, policy, full), policy, now)


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.3, 0.6, 0.9]), st.booleans())
def test_slurm_first_fit_at_2000_nodes_and_5000_jobs(seed: int, busy: float, full: bool) -> None:
    snapshot = large_world(seed, 2000, 5000, busy)
    policy, now = site("slurm", topology=("leaf",)), 3600.0
    check(snapshot, schedule(snapshot, now, policy, full), policy, now)
