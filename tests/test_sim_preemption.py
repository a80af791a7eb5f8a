"""The simulator carries a plan's preemptions, shrinks and dependency cancels out through the
control loop's applier over its fake clock: victims hold their GPUs for the grace period,
then are requeued (and run again, from their last checkpoint if they keep one) or
cancelled; elastic jobs shrink instead; invariants hold on random traces."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import NodeView, Partition, PendingJob, Policy, Qos, RunningJob, Snapshot, TaskRequest, schedule
from corral.scheduler.applier import apply_plan
from corral.scheduler.placement import FreePool, place_gang
from corral.sim.engine import cluster, simulate, to_request
from corral.sim.trace import TraceError, TraceJob, load_trace

TRACES = Path(__file__).resolve().parent / "data" / "traces"
# "high" outranks "low"; QOS "scavenger" jobs are cancelled when preempted
TIERS = Policy.named("corral", partitions=(Partition("low"), Partition("high", priority_tier=10)),
                     qos=(Qos("normal"), Qos("scavenger", preempt_mode="cancel")))


def tj(name: str, submit: float, gpus: int, duration: float, partition: str = "low", **extra) -> TraceJob:
    return TraceJob(name, extra.pop("user", "u"), submit, gpus, duration, extra.pop("limit", 4 * 3600.0),
                    partition=partition, **extra)


def by_id(result) -> dict:
    return {o.job.id: o for o in result.outcomes}


def test_a_high_tier_job_preempts_and_the_victim_is_requeued_and_runs_again_in_full() -> None:
    jobs = [tj("victim", 0.0, 8, 1000.0), tj("urgent", 100.0, 8, 100.0, "high")]
    result = simulate(jobs, cluster(1, 8), TIERS, grace_s=30.0)
    done = by_id(result)
    assert (done["urgent"].start, done["urgent"].end) == (130.0, 230.0)  # after the victim's grace period
    # back in the queue at 130 with its submit time; it restarts when the node is free and
    # runs its whole 1000 s again
    assert (done["victim"].start, done["victim"].end, done["victim"].restarts) == (0.0, 1230.0, 1)
    assert (result.preemptions, result.requeues, result.cancelled) == (1, 1, [])
    assert result.lost_gpu_s == 8 * 130.0  # 100 s of work and the 30 s grace, on 8 GPUs
    metrics = result.metrics()
    assert (metrics["preemptions"], metrics["requeues"], metrics["cancelled"], metrics["lost_gpu_s"]) == \
        (1, 1, 0, 1040.0)


def test_a_checkpointing_victim_keeps_its_work_up_to_the_last_checkpoint() -> None:
    jobs = [tj("victim", 0.0, 8, 1000.0, checkpoint_s=40.0, restart_cost_s=5.0),
            tj("urgent", 100.0, 8, 100.0, "high")]
    result = simulate(jobs, cluster(1, 8), TIERS, grace_s=30.0)
    victim = by_id(result)["victim"]
    # 100 s done at the stop: the checkpoint at 80 s is kept; 920 s left plus 5 s to restart
    assert victim.end == 230.0 + 5.0 + 920.0
    assert result.lost_gpu_s == 8 * (130.0 - 80.0) + 8 * 5.0  # the attempt less its checkpoint, the restart


@pytest.mark.parametrize("extra,why", [({"qos": "scavenger"}, "preempted (preempt mode cancel)"),
                                       ({"no_requeue": True}, "preempted (no requeue)")])
def test_a_cancel_mode_or_no_requeue_victim_is_cancelled(extra: dict, why: str) -> None:
    jobs = [tj("victim", 0.0, 8, 1000.0, **extra), tj("urgent", 100.0, 8, 100.0, "high"),
            tj("after", 101.0, 1, 10.0, dependency=(("afterok", ("victim",)),))]
    result = simulate(jobs, cluster(1, 8), TIERS, grace_s=30.0)
    assert set(by_id(result)) == {"urgent"}
    cancelled = {c.job.id: c for c in result.cancelled}
    assert (cancelled["victim"].at, cancelled["victim"].why, cancelled["victim"].start) == (130.0, why, 0.0)
    # its afterok dependent can never run now: cancelled the moment the victim is
    assert (cancelled["after"].at, cancelled["after"].start) == (130.0, None)
    assert "never be satisfied" in cancelled["after"].why
    assert (result.preemptions, result.requeues, result.metrics()["cancelled"]) == (1, 0, 2)
    assert result.lost_gpu_s == 8 * 130.0


def test_an_elastic_job_shrinks_instead_and_keeps_running() -> None:
    # 8 one-GPU replicas that may go down to 4; a second low job holds nothing to give
    jobs = [tj("elastic", 0.0, 8, 1000.0, min_gpus=4), tj("urgent", 100.0, 4, 100.0, "high")]
    result = simulate(jobs, cluster(1, 8), TIERS, grace_s=30.0, record=True)
    done = by_id(result)
    assert done["urgent"].start == 130.0
    assert (done["elastic"].end, done["elastic"].restarts) == (1000.0, 0)  # its duration unchanged
    assert (result.preemptions, result.shrinks, result.lost_gpu_s) == (0, 1, 0.0)
    ranks = sorted((h.allocation.rank, h.end) for h in result.holds if h.index == 0)
    assert ranks == [(r, 1000.0) for r in range(4)] + [(r, 130.0) for r in range(4, 8)]  # highest ranks stopped
    assert done["elastic"].gpu_s == 8 * 130.0 + 4 * 870.0


def test_a_shrink_in_its_grace_period_is_waited_for_not_topped_up_with_a_victim() -> None:
    """While the shrunk replicas stop, an arrival runs another cycle: the GPUs they hold
    count as freed soon, so no whole job is preempted on top of the shrink."""
    jobs = [tj("elastic", 0.0, 6, 1000.0, min_gpus=2), tj("small", 0.0, 2, 1000.0),
            tj("urgent", 100.0, 4, 100.0, "high"), tj("arrival", 110.0, 1, 10.0)]
    result = simulate(jobs, cluster(1, 8), TIERS, grace_s=30.0)
    assert (result.shrinks, result.preemptions) == (1, 0)
    assert by_id(result)["urgent"].start == 130.0


def test_growth_requests_never_preempt() -> None:
    """A running job's growth request (negative id) that outranks running work gets a
    preemption in the plan; the applier refuses it, and a real job of the same tier does not."""
    pool = FreePool([NodeView("n", 8, 64, 512)])
    low = PendingJob(1, (TaskRequest("main", 1, 8, 0.0, 0.0),), partition="low")
    held = place_gang(pool, low)
    running = (RunningJob(1, held, 1e9, partition="low"),)
    grow = PendingJob(-2, (TaskRequest("main", 1, 4, 0.0, 0.0),), partition="high", owner=2)
    real = replace(grow, id=3, owner=0)
    for job, evicted in ((grow, []), (real, [1])):
        snapshot = Snapshot(pool.views(), (job,), running)
        plan = schedule(snapshot, 0.0, TIERS)
        assert [p.for_job for p in plan.preemptions] == [job.id]
        applied = apply_plan(FreePool(snapshot.nodes), plan, running, TIERS)
        assert [e.job_id for e in applied.evictions] == evicted


def test_non_preemptive_replays_are_unchanged_by_trace_tiers() -> None:
    """The same trace with every job in one tier: nothing preempted, same starts as a
    trace that names no partition at all."""
    base = load_trace(TRACES / "tiresias-60.csv")
    flat = [replace(j, partition="low") for j in base]
    plain = simulate(base, cluster(2, 8), Policy.named("corral"))
    tiered = simulate(flat, cluster(2, 8), TIERS)
    assert [(o.job.id, o.start, o.end) for o in plain.outcomes] == [(o.job.id, o.start, o.end) for o in tiered.outcomes]
    assert tiered.preemptions == tiered.shrinks == 0


# -- invariants on random traces -------------------------------------------------------
@st.composite
def traces(draw) -> list[TraceJob]:
    count = draw(st.integers(2, 12))
    jobs = []
    for k in range(count):
        gpus = draw(st.integers(1, 8))
        elastic = gpus > 1 and draw(st.booleans())
        deps = ()
        if k and draw(st.integers(0, 4)) == 0:
            kind = draw(st.sampled_from(["afterok", "afterany", "afternotok"]))
            deps = ((kind, (f"j{draw(st.integers(0, k - 1))}",)),)
        jobs.append(TraceJob(f"j{k}", draw(st.sampled_from("ab")), float(draw(st.integers(0, 400))), gpus,
                             float(draw(st.integers(1, 600))), float(draw(st.sampled_from([900, 3600]))),
                             partition=draw(st.sampled_from(["low", "high"])),
                             qos=draw(st.sampled_from(["normal", "scavenger"])),
                             no_requeue=draw(st.integers(0, 5)) == 0,
                             checkpoint_s=draw(st.sampled_from([None, 50.0])),
                             restart_cost_s=draw(st.sampled_from([0.0, 7.0])),
                             min_gpus=draw(st.integers(1, gpus)) if elastic else None, dependency=deps))
    return sorted(jobs, key=lambda j: j.submit_s)


@settings(max_examples=120, deadline=None)
@given(traces(), st.sampled_from([1.0, 30.0]), st.sampled_from([None, 30.0]))
def test_gpus_never_overcommitted_gangs_whole_and_every_job_ends_once(jobs: list[TraceJob], grace: float,
                                                                      bf: float | None) -> None:
    nodes = cluster(2, 4)
    result = simulate(jobs, nodes, TIERS, bf_interval_s=bf, grace_s=grace, record=True)
    # every job ends exactly once, succeeded or cancelled; none is left waiting
    ended = [o.job.id for o in result.outcomes] + [c.job.id for c in result.cancelled]
    assert sorted(ended) == sorted(j.id for j in jobs) and result.unplaceable == 0
    # no GPU is held twice at any instant, so never more in use than the cluster has
    per_gpu = defaultdict(list)
    for hold in result.holds:
        assert hold.start <= hold.end
        for gpu in hold.allocation.gpus:
            per_gpu[(hold.allocation.node, gpu)].append((hold.start, hold.end))
    for spans in per_gpu.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    edges = sorted([(h.start, len(h.allocation.gpus)) for h in result.holds] +
                   [(h.end, -len(h.allocation.gpus)) for h in result.holds], key=lambda e: (e[0], e[1]))
    busy = 0
    for _, delta in edges:
        busy += delta
        assert busy <= 8
    # a gang starts whole: every attempt's first instant holds all its replicas
    starts = defaultdict(list)
    for hold in result.holds:
        starts[(hold.index, hold.start)].append(hold.allocation)
    replicas = {i: sum(t.replicas for t in to_request(job, i, 4).tasks) for i, job in enumerate(jobs)}
    for (index, at), allocs in starts.items():
        assert len(allocs) == replicas[index], f"{jobs[index].id} started at {at} with {len(allocs)} replicas"
    # a job without checkpoints that succeeded ran its whole duration in its last attempt
    for i, job in enumerate(jobs):
        outcome = next((o for o in result.outcomes if o.job.id == job.id), None)
        if outcome is not None and job.checkpoint_s is None:
            last = max(h.start for h in result.holds if h.index == i)
            expected = job.duration_s + (job.restart_cost_s if outcome.restarts else 0.0)
            assert outcome.end - last == pytest.approx(expected)
    cancelled_by_preemption = sum(c.why.startswith("preempted") for c in result.cancelled)
    assert result.preemptions == result.requeues + cancelled_by_preemption
    assert result.lost_gpu_s >= 0


# -- the trace's optional columns and the CLI --------------------------------------------
def test_trace_columns_are_optional_and_bad_values_name_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,user,submit_s,gpus,duration_s,gpu_type,partition,qos,no_requeue,checkpoint_s,"
                    "restart_cost_s,min_gpus,dependency\n"
                    "a,u,0,4,100,,high,scavenger,1,60,5,2,\n"
                    "b,u,1,1,10,,,,,,,,afterok:a:c\n")
    a, b = load_trace(path)
    assert (a.partition, a.qos, a.no_requeue, a.checkpoint_s, a.restart_cost_s, a.min_gpus) == \
        ("high", "scavenger", True, 60.0, 5.0, 2)
    assert (b.partition, b.checkpoint_s, b.min_gpus, b.dependency) == ("", None, None, (("afterok", ("a", "c")),))
    plain = load_trace(TRACES / "tiresias-60.csv")[0]
    assert (plain.partition, plain.no_requeue, plain.min_gpus, plain.dependency) == ("", False, None, ())
    for column, value, message in (("min_gpus", "5", "min_gpus: must be a whole number from 1"),
                                   ("checkpoint_s", "-1", "checkpoint_s: must be a finite number"),
                                   ("no_requeue", "maybe", "no_requeue: expected"),
                                   ("dependency", "before:a", "dependency: expected KIND:ID")):
        path.write_text(f"job_id,user,submit_s,gpus,duration_s,{column}\nx,u,0,1,5,\ny,u,0,4,5,{value}\n")
        with pytest.raises(TraceError, match=rf"t\.csv:3: {message}"):
            load_trace(path)


def test_a_dependency_on_a_job_not_in_the_trace_cancels_it() -> None:
    jobs = [tj("a", 0.0, 1, 10.0, dependency=(("afterany", ("nowhere",)),)), tj("b", 0.0, 1, 10.0)]
    result = simulate(jobs, cluster(1, 8), TIERS)
    assert [c.job.id for c in result.cancelled] == ["a"] and [o.job.id for o in result.outcomes] == ["b"]


def test_sim_cli_replays_a_sites_preemption_and_prints_the_counters(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("scheduler:\n  policy: corral\n"
                      "partitions:\n  - {name: low, max_time: 10m}\n"
                      "  - {name: high, priority_tier: 10}\n")
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,user,submit_s,gpus,duration_s,partition\n0,u,0,8,1000,low\n1,u,100,8,100,high\n")
    args = [sys.executable, "-m", "corral.cli.main", "sim", "--trace", str(trace), "--nodes", "1", "--config",
            str(config), "--grace", "10"]
    metrics = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, check=True).stdout)
    assert (metrics["jobs"], metrics["preemptions"], metrics["requeues"], metrics["cancelled"]) == (2, 1, 1, 0)
    assert metrics["lost_gpu_s"] == 8 * 110.0
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert any(line.split() == ["preemptions", "1"] for line in text.splitlines())
    bad = subprocess.run([*args[:-2], "--grace", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--grace" in bad.stderr
