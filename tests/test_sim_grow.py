"""The simulator's elastic jobs that grow on their own (trace column ``max_gpus``): they take
idle GPUs up to their max, their work goes at a pace linear in the GPUs held (grown GPUs at
``GROWN_EFFICIENCY``), they give back what they grew when a job arrives, and no GPU is ever
held twice."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from corral.scheduler import Policy
from corral.sim.engine import GROWN_EFFICIENCY, cluster, simulate
from corral.sim.trace import TraceJob

CORRAL = Policy.named("corral")


def tj(name: str, submit: float, gpus: int, duration: float, **extra) -> TraceJob:
    return TraceJob(name, extra.pop("user", name), submit, gpus, duration, extra.pop("limit", 4 * 3600.0), **extra)


def by_id(result) -> dict:
    return {o.job.id: o for o in result.outcomes}


def never_overcommitted(result) -> None:
    spans = defaultdict(list)
    for hold in result.holds:
        for gpu in hold.allocation.gpus:
            spans[(hold.allocation.node, gpu)].append((hold.start, hold.end))
    for key, held in spans.items():
        held.sort()
        for (_, end), (start, _) in zip(held, held[1:]):
            assert start >= end, f"GPU {key} held twice"


def test_a_growing_job_alone_fills_the_idle_gpus_and_finishes_sooner() -> None:
    job = tj("grower", 0.0, 2, 1000.0, min_gpus=1, max_gpus=8)
    result = simulate([job], cluster(1, 8), CORRAL, record=True)
    done = by_id(result)["grower"]
    assert result.grown == 6
    assert done.end == pytest.approx(2 * 1000.0 / (2 + GROWN_EFFICIENCY * 6))
    never_overcommitted(result)


def test_without_max_gpus_nothing_grows_and_the_end_is_as_before() -> None:
    job = tj("plain", 0.0, 2, 1000.0, min_gpus=1)
    result = simulate([job], cluster(1, 8), CORRAL)
    assert result.grown == 0 and by_id(result)["plain"].end == 1000.0


def test_a_site_that_turns_growth_off() -> None:
    job = tj("grower", 0.0, 2, 1000.0, min_gpus=1, max_gpus=8)
    result = simulate([job], cluster(1, 8), replace(CORRAL, grow=False))
    assert result.grown == 0 and by_id(result)["grower"].end == 1000.0


def test_what_it_grew_goes_back_to_an_arriving_job_which_starts_after_the_grace() -> None:
    jobs = [tj("grower", 0.0, 2, 1000.0, min_gpus=1, max_gpus=8), tj("other", 100.0, 4, 100.0)]
    result = simulate(jobs, cluster(1, 8), CORRAL, grace_s=30.0, record=True)
    done = by_id(result)
    assert done["other"].start == 130.0  # its 4 GPUs: lent to the grower, back after the grace
    assert result.shrinks == 1 and result.preemptions == 0
    # the grower worked 100 s on 8, then on 4, then (after settling) grew again once other ended
    assert done["grower"].end < 1000.0
    never_overcommitted(result)


def test_a_big_job_takes_back_all_that_was_lent() -> None:
    jobs = [tj("small", 0.0, 4, 500.0, limit=500.0), tj("grower", 1.0, 2, 5000.0, min_gpus=2, max_gpus=16),
            tj("big", 2.0, 8, 100.0, limit=200.0)]
    result = simulate(jobs, cluster(2, 8), CORRAL, grace_s=30.0, record=True)
    done = by_id(result)
    assert result.grown >= 10 and done["big"].start == 32.0  # the grower's lent GPUs, after the grace
    never_overcommitted(result)


def test_growth_keeps_a_reservation_in_place() -> None:
    """A 8-GPU job is reserved at 500 when a 4-GPU job ends; a grower that backfills (its limit
    ends before 500) grows into the 2 GPUs left, which ends before the reservation too, and the
    big job still starts at 500."""
    jobs = [tj("small", 0.0, 4, 500.0, limit=500.0), tj("big", 1.0, 8, 100.0, limit=200.0),
            tj("grower", 2.0, 2, 300.0, min_gpus=2, max_gpus=8, limit=400.0)]
    result = simulate(jobs, cluster(1, 8), CORRAL, record=True)
    done = by_id(result)
    assert done["big"].start == 500.0 and done["grower"].start == 2.0
    assert result.grown == 2 and done["grower"].end < 302.0
    never_overcommitted(result)


def test_the_trace_column_max_gpus_is_read_and_checked(tmp_path) -> None:
    from corral.sim.trace import TraceError, load_trace

    path = tmp_path / "t.csv"
    path.write_text("job_id,user,submit_s,gpus,duration_s,min_gpus,max_gpus\nj1,u,0,2,100,1,8\n")
    (job,) = load_trace(path)
    assert (job.min_gpus, job.max_gpus) == (1, 8)
    for row, words in (("j1,u,0,2,100,,8", "on an elastic job"), ("j1,u,0,2,100,1,2", "above the job's gpus")):
        path.write_text(f"job_id,user,submit_s,gpus,duration_s,min_gpus,max_gpus\n{row}\n")
        with pytest.raises(TraceError, match="max_gpus") as caught:
            load_trace(path)
        assert words in str(caught.value)
