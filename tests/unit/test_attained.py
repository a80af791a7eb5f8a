"""Preemption for shorter work within a tier (``Policy.las``, least attained service): which
running job a pending one may stop, the guards against thrashing and starvation, the tier
order kept, and the simulator carrying the stops out and accounting them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings, strategies as st

from corral.scheduler import Allocation, Partition, Policy, Qos, RunningJob, Snapshot, schedule
from corral.scheduler.attained import pending_level
from corral.scheduler.policy import Las
from corral.sim.engine import cluster, simulate
from corral.sim.trace import TraceJob
from tests.builders import job, node, task

LAS = Las(thresholds_gpu_s=(3600.0, 8 * 3600.0), min_run_factor=3.0, min_run_s=600.0, max_preempted=2,
          promote_after=4.0)
POLICY = Policy.named("corral", las=LAS)
NOW = 10_000.0


def _running(job_id: int, gpus: int, started_at: float = 0.0, node_name: str = "n0", first: int = 0,
             **kw) -> RunningJob:
    alloc = Allocation("main", 0, node_name, tuple(range(first, first + gpus)), 0.0, 0.0)
    kw.setdefault("preemptible", True)
    return RunningJob(job_id, (alloc,), NOW + 86400.0, user=f"u{job_id}", started_at=started_at, **kw)


def _busy(*running: RunningJob) -> list:
    held: dict[str, set[int]] = defaultdict(set)
    for r in running:
        for a in r.allocations:
            held[a.node].update(a.gpus)
    return [node(n, gpus=8, free_gpus=set(range(8)) - held[n]) for n in ("n0", "n1") if n in held or n == "n0"]


def _plan(pending, *running: RunningJob, policy: Policy = POLICY):
    return schedule(Snapshot(tuple(_busy(*running)), tuple(pending), tuple(running)), NOW, policy)


def test_a_new_job_stops_the_running_job_with_the_most_attained_service() -> None:
    old = _running(1, 4, started_at=0.0)  # 4 GPUs x 10,000 s: 11.1 GPU-h, the lowest queue
    younger = _running(2, 4, started_at=NOW - 3000, first=4)  # 3.3 GPU-h, the middle one
    short = job(3, task(gpus=4), submitted_at=NOW - 2400)
    plan = _plan([short], old, younger)
    assert [(p.for_job, p.victims) for p in plan.preemptions] == [(3, (1,))]
    assert plan.preemptions[0].notes == ((1, "preempted for shorter work: attained 11.1 GPU-h, job 3 waited 40 min"),)


def test_off_by_default_and_never_a_job_that_did_not_declare_it_checkpoints() -> None:
    old = _running(1, 8)
    assert _plan([job(3, task(gpus=4))], old, policy=Policy.named("corral")).preemptions == []
    assert _plan([job(3, task(gpus=4))], _running(1, 8, preemptible=False)).preemptions == []
    assert _plan([job(3, task(gpus=4))], _running(1, 8, no_requeue=True)).preemptions == []


def test_guards_min_run_since_its_start_and_max_preemptions() -> None:
    # ran 29 min of the 30 min its 10-min restart cost x 3 asks: not yet; at 31 min it may be stopped
    recent = _running(1, 8, started_at=NOW - 29 * 60, restart_cost_s=600.0, attained_gpu_s=20 * 3600.0)
    assert _plan([job(3, task(gpus=8))], recent).preemptions == []
    ready = _running(1, 8, started_at=NOW - 31 * 60, restart_cost_s=600.0, attained_gpu_s=20 * 3600.0)
    assert _plan([job(3, task(gpus=8))], ready).preemptions[0].victims == (1,)
    worn = _running(1, 8, started_at=0.0, preempted=2)
    assert _plan([job(3, task(gpus=8))], worn).preemptions == []


def test_only_a_higher_queue_takes_gpus() -> None:
    # the running job has 0.9 GPU-h: the same (top) queue as a new job, so no stop
    assert _plan([job(3, task(gpus=8))], _running(1, 1, started_at=NOW - 3240)).preemptions == []
    # a pending job that already attained 9 GPU-h waits in the lowest queue
    again = job(3, task(gpus=8), submitted_at=NOW - 5000)
    again = replace(again, attained_gpu_s=9 * 3600.0)
    assert _plan([again], _running(1, 8, started_at=0.0)).preemptions == []


def test_starvation_promotion_puts_a_long_waiting_job_back_in_the_top_queue() -> None:
    ran = 3600.0  # it attained 8 GPU-h on 8 GPUs: ran 1 h
    pending = replace(job(3, task(gpus=8)), attained_gpu_s=8 * ran)
    assert pending_level(replace(pending, submitted_at=NOW - ran - 4 * ran + 1), NOW, LAS) == 2
    assert pending_level(replace(pending, submitted_at=NOW - ran - 4 * ran), NOW, LAS) == 0


def test_the_tier_order_stays() -> None:
    tiers = Policy.named("corral", las=LAS, partitions=(Partition("low"), Partition("high", priority_tier=1)))
    high = _running(1, 8, partition="high")
    assert _plan([job(3, task(gpus=8))], high, policy=tiers).preemptions == []  # low never stops high
    qos = Policy.named("corral", las=LAS, qos=(Qos("normal"), Qos("boss", preempt=("normal",))))
    boss = _running(1, 8, qos="boss")
    normal = replace(job(3, task(gpus=8)), qos="normal")
    assert _plan([normal], boss, policy=qos).preemptions == []  # its QOS outranks
    # a tier above still wins: a high job stops a low one whether it checkpoints or not
    urgent = replace(job(3, task(gpus=8)), partition="high")
    plan = _plan([urgent], _running(1, 8, partition="low", preemptible=False), policy=tiers)
    assert plan.preemptions[0].victims == (1,) and plan.preemptions[0].notes == ()


# -- the simulator: preemptions applied, requeued, accounted ---------------------------------

def _trace_job(name: str, submit: float, gpus: int, run: float, checkpoint: float | None = None,
               cost: float = 0.0) -> TraceJob:
    return TraceJob(name, f"u{name}", submit, gpus, run, max(run, 60.0) * 2, checkpoint_s=checkpoint,
                    restart_cost_s=cost)


def test_the_simulator_requeues_a_long_checkpointing_job_for_a_short_one() -> None:
    jobs = [_trace_job("long", 0.0, 8, 20_000.0, checkpoint=1800.0, cost=300.0),
            _trace_job("short", 4000.0, 8, 600.0)]
    result = simulate(jobs, cluster(1, 8), POLICY, grace_s=30.0)
    ends = {o.job.id: o for o in result.outcomes}
    assert result.preemptions == 1 and result.requeues == 1
    assert ends["short"].start == 4000.0 + 30.0  # it waited only the victim's grace period
    long = ends["long"]
    assert long.restarts == 1
    # the long job kept its work to the 3600-s checkpoint: it ran 4000 + 30 s, lost 430 s of it,
    # then the rest (16,400 s) plus its 300-s restart cost after the short job
    assert long.end == 4030.0 + 600.0 + 300.0 + 16_400.0
    assert result.lost_gpu_s == 8 * (430.0 + 300.0)
    baseline = simulate(jobs, cluster(1, 8), Policy.named("corral"), grace_s=30.0)
    assert baseline.preemptions == 0
    assert {o.job.id: o.start for o in baseline.outcomes}["short"] == 20_000.0


# -- a property: in random small worlds every job ends within the stated bound ---------------

GRACE = 30.0
SMALL = Policy.named("corral", las=Las(thresholds_gpu_s=(600.0, 3600.0), min_run_factor=2.0, min_run_s=60.0,
                                       max_preempted=2, promote_after=2.0))


@st.composite
def worlds(draw):
    n = draw(st.integers(2, 8))
    out = []
    for k in range(n):
        run = draw(st.floats(60.0, 6000.0))
        checkpoint = draw(st.one_of(st.none(), st.floats(60.0, 1800.0)))
        out.append(_trace_job(str(k), draw(st.floats(0.0, 4000.0)), draw(st.integers(1, 4)), run,
                              checkpoint, draw(st.floats(0.0, 300.0)) if checkpoint else 0.0))
    return out


@settings(max_examples=60, deadline=None)
@given(worlds(), st.integers(1, 2))
def test_every_job_ends_within_the_bound_is_stopped_at_most_n_times_and_nothing_is_overcommitted(jobs, nodes):
    result = simulate(jobs, cluster(nodes, 4), SMALL, grace_s=GRACE, record=True)
    assert len(result.outcomes) == len(jobs) and not result.cancelled
    n = SMALL.las.max_preempted
    # The bound: while a job waits, some job runs or is being stopped (every job fits the empty
    # cluster), and each attempt lasts at most its job's run time plus what a stop loses (work
    # since the last checkpoint, the restart cost, the grace period), at most n times per job.
    bound = max(j.submit_s for j in jobs) + sum(j.duration_s + n * ((j.checkpoint_s or 0.0) + j.restart_cost_s
                                                                    + GRACE) for j in jobs)
    for o in result.outcomes:
        assert o.restarts <= n
        assert not o.restarts or o.job.checkpoint_s  # only declared checkpointing jobs are stopped
        assert o.end <= bound + 1e-6
    held: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for h in result.holds:
        for g in h.allocation.gpus:
            held[(h.allocation.node, g)].append((h.start, h.end))
    for spans in held.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no GPU held twice at once
