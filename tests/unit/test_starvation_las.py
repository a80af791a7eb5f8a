"""The starve limit under preemption for shorter work (``Policy.las``): the oldest starving
job of the top LAS queue is first in line, and no job stops shorter work to run on the GPUs a
starving job's reservation counts on, so the bound of docs/scheduling.md ("Starving jobs")
holds with ``las`` on as without it (a job stopped for shorter work earlier gets its lane once
its wait puts it back in the top queue)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from corral.scheduler import Allocation, PendingJob, Policy, RunningJob, Snapshot, priorities, schedule
from corral.scheduler.attained import pending_level
from corral.scheduler.backfill import Book, Timeline, reserve
from corral.scheduler.placement import FreePool, Scope
from corral.scheduler.plan import Reason
from corral.scheduler.policy import Las
from tests.builders import node, task
from tests.unit.test_backfill import busy_world

NOW = 100_000.0
LAS = Las(thresholds_gpu_s=(3600.0, 8 * 3600.0), min_run_factor=3.0, min_run_s=600.0, max_preempted=2,
          promote_after=4.0)


def _job(job_id: int, gpus: int, limit: float, submitted: float, user: str, replicas: int = 1) -> PendingJob:
    return PendingJob(job_id, (task("t", replicas, gpus=gpus),), submitted, user, user, limit)


def _held(job_id: int, node_name: str, gpus: range, end: float, **kw) -> RunningJob:
    return RunningJob(job_id, (Allocation("t", 0, node_name, tuple(gpus), 0.0, 0.0),), end, "c", "c", **kw)


def test_no_job_stops_shorter_work_to_run_on_a_starving_jobs_reserved_gpus() -> None:
    # n0 is held to NOW+5000 by work that may not be stopped; on n1 an old checkpointing job
    # (4 GPUs since t=0: the lowest queue) ends at NOW+1000 beside 4 idle GPUs
    fixed = _held(1, "n0", range(8), NOW + 5000)
    old = _held(2, "n1", range(4), NOW + 1000, started_at=0.0, preemptible=True)
    nodes = (node("n0", gpus=8, free_gpus=set()), node("n1", gpus=8, free_gpus={4, 5, 6, 7}))
    # S (2 x 8 GPUs) has waited past its starve limit: reserved on both nodes at NOW+5000; P
    # is new, in the top queue, 8 GPUs for up to 2 h
    starving = _job(10, 8, 7200.0, NOW - 3 * 3600, "s", replicas=2)
    new = _job(11, 8, 7200.0, NOW, "p")
    policy = Policy.named("corral", las=LAS)
    policy = replace(policy, weights=replace(policy.weights, starve_after_s=600.0))
    snap = Snapshot(nodes, (starving, new), (fixed, old))
    ranks = priorities(snap, NOW, policy)
    assert ranks[10].starving(3 * 3600) and not ranks[11].starving(0.0)
    plan = schedule(snap, NOW, policy)
    assert plan.reserved_starts[10] == NOW + 5000
    # P may not stop job 2 to hold n1 past S's start (before: it did, and S waited for P)
    assert plan.preemptions == []
    # with a limit that ends before S's start, P may stop job 2, and S's start is kept
    short = replace(new, time_limit=600.0)
    plan = schedule(Snapshot(nodes, (starving, short), (fixed, old)), NOW, policy)
    assert [(p.for_job, p.victims) for p in plan.preemptions] == [(11, (2,))]
    assert plan.reserved_starts[10] == NOW + 5000


@st.composite
def las_worlds(draw):
    """test_backfill's busy worlds with LAS: running jobs checkpoint and attained some
    service, pending ones may have attained some before (a lower queue)."""
    snap = draw(busy_world())
    running = tuple(replace(r, preemptible=True, started_at=0.0, attained_gpu_s=draw(st.sampled_from([0.0, 30.0])))
                    for r in snap.running)
    pending = tuple(replace(j, attained_gpu_s=draw(st.sampled_from([0.0, 0.0, 5.0, 50.0]))) for j in snap.pending)
    return replace(snap, running=running, pending=pending)


SMALL = Las(thresholds_gpu_s=(2.0, 20.0), min_run_factor=0.0, min_run_s=0.0, max_preempted=2, promote_after=4.0)


@settings(max_examples=300, deadline=None)
@given(las_worlds(), st.floats(0.0, 24.0))
def test_the_oldest_starving_job_is_first_in_line_under_las(snap: Snapshot, starve: float) -> None:
    """As test_backfill's property without LAS: the oldest starving job of the top queue that
    neither starts nor waits for victims is reserved exactly where it would be with only the
    older such jobs ahead of it, whatever the younger jobs' queues."""
    now = 13.0  # jobs were submitted at t = 1, 2, ...
    base = Policy.named("corral", las=SMALL)
    policy = replace(base, weights=replace(base.weights, starve_after_s=starve))
    plan = schedule(snap, now, policy)
    started = {s.job_id: s for s in plan.starts}
    ranks = priorities(snap, now, policy)
    starving = sorted((j for j in snap.pending
                       if j.assoc in plan.hungry and ranks[j.id].starving(now - j.submitted_at)
                       and pending_level(j, now, SMALL) == 0),
                      key=lambda j: (j.submitted_at, j.id))
    first = next((j for j in starving if j.id not in started), None)
    if first is None or plan.reasons.get(first.id) is Reason.PREEMPTING:
        return
    ahead = starving[:starving.index(first)]
    if any(p.for_job in {j.id for j in ahead} for p in plan.preemptions):
        return  # an older starving job stops work for itself: not what this reference replays
    pool, timeline = FreePool(snap.nodes), Timeline()
    for r in snap.running:
        timeline.add(r.expected_end, r.allocations)
    for j in ahead:
        for a in started[j.id].allocations:
            pool.assume(a)
        timeline.add(now + j.time_limit, started[j.id].allocations)
    found = reserve(first, Book(pool), timeline, now, Scope())
    if found is None:  # larger than the cluster
        assert first.id not in plan.reserved_starts
    else:
        assert plan.reserved_starts[first.id] == found.start
