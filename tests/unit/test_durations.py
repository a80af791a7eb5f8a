"""Run times learned from history: the model, planning with predictions (backfill and
the size factor), the strict reservation a starving job gets whatever the predictions
say, and the bound on waiting that gives in a replay."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, task
from corral.scheduler import PendingJob, Reason, Snapshot, priorities, schedule
from corral.scheduler.backfill import Book, Timeline, reserve
from corral.scheduler.core import Policy
from corral.scheduler.durations import DurationModel, accuracy, planned_end
from corral.scheduler.placement import FreePool, Scope, place_gang
from corral.scheduler.snapshot import RunningJob
from corral.sim.engine import cluster, simulate
from corral.sim.trace import TraceJob

SLURM_LEARNING = Policy.named("slurm", learn_durations=True)


def test_no_history_no_prediction_then_the_geometric_mean_of_the_last_runs() -> None:
    model = DurationModel(depth=3)
    assert model.predict("ann", "train", 8, 3600.0) is None
    for run in (100.0, 400.0, 1600.0, 6400.0):  # the first falls out of a depth of 3
        model.observe("ann", "train", 8, run)
    assert math.isclose(model.predict("ann", "train", 8, None), 1600.0)
    # never above the job's own limit (it cannot run longer), never below a minute
    assert model.predict("ann", "train", 8, 900.0) == 900.0
    model.observe("bob", "", 1, 2.0)
    assert model.predict("bob", "", 1, None) == 60.0


def test_the_most_specific_history_wins_and_falls_back_to_the_user() -> None:
    model = DurationModel()
    model.observe("ann", "train", 8, 8000.0)
    model.observe("ann", "eval", 1, 500.0)
    assert model.predict("ann", "train", 8, None) == pytest.approx(8000.0)
    assert model.predict("ann", "eval", 1, None) == pytest.approx(500.0)
    # a new name with 8 GPUs: the user's 8-GPU history; a new shape: all the user's runs
    assert model.predict("ann", "sweep", 8, None) == pytest.approx(8000.0)
    assert math.isclose(model.predict("ann", "sweep", 2, None), math.sqrt(8000.0 * 500.0))
    assert model.predict("carl", "train", 8, None) is None  # another user's history is not theirs


def test_bad_run_times_teach_nothing() -> None:
    model = DurationModel()
    for bad in (0.0, -5.0, math.inf, math.nan):
        model.observe("ann", "", 1, bad)
    assert model.predict("ann", "", 1, None) is None and model.version == 0


def test_a_running_job_past_its_prediction_is_planned_to_its_limit() -> None:
    assert planned_end(100.0, 50.0, 3600.0, now=120.0) == 150.0
    assert planned_end(100.0, 50.0, 3600.0, now=150.0) == 3700.0
    assert planned_end(100.0, None, 3600.0, now=120.0) == 3700.0
    assert planned_end(100.0, 50.0, None, now=200.0) == math.inf


def test_accuracy_against_the_limits() -> None:
    # predictions 1x, 3x, 0.5x the real run; limits 10x each
    score = accuracy([(100.0, 100.0, 1000.0), (300.0, 100.0, 1000.0), (50.0, 100.0, 1000.0)])
    assert score.jobs == 3 and math.isclose(score.within_2x, 2 / 3) and score.median_ratio == 1.0
    assert score.limit_within_2x == 0.0 and score.limit_median_ratio == 10.0
    assert accuracy([]).jobs == 0


def pending(job_id: int, gpus: int, limit: float, submitted: float = 0.0, user: str = "a",
            expected: float | None = None) -> PendingJob:
    return PendingJob(job_id, (task("t", 1, gpus=gpus),), submitted, user, user, limit, expected=expected)


def busy(nodes, running: list[tuple[int, int, float, float]], jobs: list[PendingJob]) -> Snapshot:
    """``running``: (id, GPUs, predicted end, end at its limit)."""
    pool = FreePool(nodes)
    held = []
    for job_id, gpus, end, latest in running:
        allocs = place_gang(pool, pending(job_id, gpus, 1))
        held.append(RunningJob(job_id, allocs, end, "z", "z", limit_end=latest))
    return Snapshot(pool.views(), tuple(jobs), tuple(held))


def test_a_job_predicted_short_backfills_where_its_limit_would_not_fit() -> None:
    # 8 GPUs, 6 busy until t=100; job 1 (8 GPUs) reserves t=100. Job 2 asks 500 s but its
    # user's jobs of that shape ran ~50 s: planned with its prediction it is done by then.
    snap = busy([node("n", gpus=8)], [(9, 6, 100.0, 100.0)],
                [pending(1, 8, 1000), pending(2, 2, 500, 1.0, expected=50.0)])
    plan = schedule(snap, 0.0, SLURM_LEARNING)
    assert [s.job_id for s in plan.starts] == [2] and plan.reserved_starts[1] == 100.0
    # with its limit alone (Slurm's way) it would run past t=100 and may not start
    plan = schedule(replace(snap, pending=(pending(1, 8, 1000), pending(2, 2, 500, 1.0))), 0.0, SLURM_LEARNING)
    assert plan.starts == [] and plan.reasons[2] == Reason.PRIORITY


def test_the_size_factor_ranks_by_the_predicted_area() -> None:
    corral = Policy.named("corral", learn_durations=True)
    snap = Snapshot((node("n", gpus=8),), (pending(1, 4, 86400, expected=600.0), pending(2, 4, 3600)))
    ranks = priorities(snap, 0.0, corral)
    assert ranks[1].job_size > ranks[2].job_size  # 4 GPUs x 10 min before 4 GPUs x 1 h


def starving_policy(over_share: float = math.inf, starve_after_s: float = 600.0) -> Policy:
    base = Policy.named("corral", learn_durations=True)
    return replace(base, weights=replace(base.weights, starve_after_s=starve_after_s, starve_over_share=over_share))


def test_a_starving_job_is_reserved_by_the_limits_and_nothing_may_push_it_back() -> None:
    # Job 9 holds 6 of 8 GPUs; predicted to end at t=100, but its limit is t=1000. Job 1 (8
    # GPUs, user b, short of their share) has starved; job 2 (2 GPUs) is predicted to take
    # 50 s but may run to its limit of 2000 s.
    now = 5000.0
    jobs = [pending(1, 8, 3600, 0.0, user="b"), pending(2, 2, 2000, now - 1, user="c", expected=50.0)]
    snap = busy([node("n", gpus=8)], [(9, 6, now + 100.0, now + 1000.0)], jobs)
    policy = starving_policy()
    plan = schedule(snap, now, policy)
    # its start is sure only at job 9's limit, and job 2 could still be running then
    assert plan.reserved_starts[1] == now + 1000.0
    assert plan.starts == [] and plan.reasons[2] == Reason.PRIORITY
    # a job whose limit ends before that start may go around it
    short = replace(snap, pending=(jobs[0], pending(2, 2, 900, now - 1, user="c", expected=50.0)))
    assert [s.job_id for s in schedule(short, now, policy).starts] == [2]
    # not starving yet (at t=60): the reservation is planned with the prediction, and job 2,
    # predicted done before it, goes around it
    early = replace(snap, pending=(replace(jobs[0], submitted_at=now - 60), jobs[1]))
    plan = schedule(early, now, policy)
    assert plan.reserved_starts[1] == now + 100.0 and [s.job_id for s in plan.starts] == [2]


def test_a_user_over_their_share_starves_only_with_starve_over_share() -> None:
    # user b holds all 8 GPUs (its share and more): no starving lane for its 8-GPU job,
    # unless starve_over_share says how much longer it may wait
    now = 5000.0
    snap = busy([node("n", gpus=8)], [(9, 8, now + 100.0, now + 1000.0)], [pending(1, 8, 3600, 0.0, user="z")])
    plan = schedule(snap, now, starving_policy())
    assert plan.reserved_starts[1] == now + 100.0  # planned with the prediction: not owed
    plan = schedule(snap, now, starving_policy(over_share=2.0))
    assert plan.reserved_starts[1] == now + 1000.0  # waited 5000 s >= 2 x 600 x (1 - size)
    factors = priorities(snap, now, starving_policy(over_share=2.0))[1]
    assert not starving_policy(over_share=20.0).owed(factors, now, hungry=False)
    assert starving_policy(over_share=20.0).owed(factors, now, hungry=True)


@st.composite
def predicted_world(draw):
    nodes = [node(f"n{i}", gpus=draw(st.sampled_from([4, 8]))) for i in range(draw(st.integers(1, 3)))]
    pool = FreePool(nodes)
    running = []
    for job_id in range(100, 100 + draw(st.integers(0, 6))):
        allocs = place_gang(pool, pending(job_id, draw(st.integers(1, 8)), 1))
        if allocs is not None:
            end = float(draw(st.integers(1, 500)))
            latest = end + draw(st.integers(0, 2000))
            user = draw(st.sampled_from("ab"))
            running.append(RunningJob(job_id, allocs, end, user, user, limit_end=latest))
    jobs = []
    for i in range(1, draw(st.integers(2, 10))):
        limit = float(draw(st.integers(60, 3000)))
        expected = draw(st.none() | st.floats(60.0, limit))
        jobs.append(replace(pending(i, draw(st.integers(1, 8)), limit, float(draw(st.integers(0, 5000))),
                                    draw(st.sampled_from("ab")), expected)))
    return Snapshot(pool.views(), tuple(jobs), tuple(running))


@settings(max_examples=200, deadline=None)
@given(predicted_world(), st.sampled_from([0.0, 1.0, math.inf]))
def test_strict_reservations_hold_against_every_start_and_nothing_is_overcommitted(snap: Snapshot,
                                                                                   over_share: float) -> None:
    # every job of a user short of their share that waited 600 s x (1 - size) is owed; with
    # over_share 0 or 1 everyone's old jobs are
    policy = starving_policy(over_share)
    now = 5000.0
    plan = schedule(snap, now, policy)
    ranks = plan.priorities
    owed = {j.id for j in snap.pending if policy.owed(ranks[j.id], now - j.submitted_at, j.assoc in plan.hungry)}
    # Replay the strict ones in plan order against the worst case: running jobs and every
    # start end at their limits. None may start later than the plan promised.
    pool, timeline = FreePool(snap.nodes), Timeline()
    for r in snap.running:
        timeline.add(r.latest_end, r.allocations)
    jobs = {j.id: j for j in snap.pending}
    for s in plan.starts:
        for a in s.allocations:
            pool.assume(a)
        timeline.add(now + jobs[s.job_id].time_limit, s.allocations)
    book = Book(pool)
    for job_id, promised in plan.reserved_starts.items():
        if job_id not in owed:
            break  # owed jobs queue first (one tier here): the rest are planned with predictions
        found = reserve(jobs[job_id], book, timeline, now, Scope())
        assert found is not None and found.start <= promised + 1e-6
        book.add(replace(found, start=promised, allocations=plan.reserved_on[job_id],
                         end=promised + jobs[job_id].run_s), timeline)
    # gangs whole, no GPU twice
    used: dict[str, set[int]] = defaultdict(set)
    for s in plan.starts:
        assert len(s.allocations) == 1
        for a in s.allocations:
            assert set(a.gpus) <= set(next(n for n in snap.nodes if n.name == a.node).free_gpus)
            assert not used[a.node] & set(a.gpus)
            used[a.node] |= set(a.gpus)


def trace_job(i: int, user: str, submit: float, gpus: int, duration: float, limit: float) -> TraceJob:
    return TraceJob(str(i), user, submit, gpus, duration, limit)


def test_a_replay_learns_each_users_run_times_as_their_jobs_end() -> None:
    jobs = [trace_job(i, "ann", i * 1000.0, 1, 300.0, 3600.0) for i in range(4)]
    jobs += [trace_job(9, "bob", 10.0, 2, 50.0, 900.0)]
    result = simulate(sorted(jobs, key=lambda j: j.submit_s), cluster(1, 8), Policy.named("corral",
                                                                                          learn_durations=True))
    predicted = {o.job.id: o.predicted for o in result.outcomes}
    assert predicted["0"] is None and predicted["9"] is None  # nothing learned yet
    assert predicted["1"] == pytest.approx(300.0) and predicted["3"] == pytest.approx(300.0)
    plain = simulate(sorted(jobs, key=lambda j: j.submit_s), cluster(1, 8), Policy.named("corral"))
    assert all(o.predicted is None for o in plain.outcomes)


def test_a_starving_gang_is_not_chased_away_by_jobs_that_outrun_their_predictions() -> None:
    # One user's history says 1-GPU jobs take 60 s (eight at t=0); from t=61 every new one
    # runs 3000 s (limit 3600 s): eight fill the node, then one every 100 s, more than 8
    # GPUs can hold. Another user's 8-GPU job arrives at t=70. Planned with predictions
    # alone, each cycle reserves it the GPUs "about to end" and the next stream job,
    # predicted done before then, goes around it.
    jobs = [trace_job(i, "stream", 0.0, 1, 60.0, 3600.0) for i in range(8)]
    jobs += [trace_job(10 + i, "stream", 61.0 + i, 1, 3000.0, 3600.0) for i in range(8)]
    jobs += [trace_job(100 + i, "stream", 100.0 * (i + 1), 1, 3000.0, 3600.0) for i in range(300)]
    jobs += [trace_job(999, "gang", 70.0, 8, 600.0, 3600.0)]
    jobs.sort(key=lambda j: j.submit_s)

    def waited(policy: Policy) -> float:
        gang = next(o for o in simulate(jobs, cluster(1, 8), policy).outcomes if o.job.id == "999")
        return gang.start - gang.job.submit_s

    chased = waited(starving_policy(starve_after_s=math.inf))
    # Owed its turn once it waited starve_after x (1 - size), it is reserved by the limits
    # and starts within that plus one limit: nothing older is owed ahead of it.
    policy = starving_policy()
    threshold = priorities(Snapshot((node("n", gpus=8),), (pending(1, 8, 3600.0, user="gang"),)), 0.0,
                           policy)[1].starve_s
    assert waited(policy) <= threshold + 3600.0 < chased


def test_a_history_is_trusted_only_when_its_runs_agree() -> None:
    from corral.scheduler.durations import DurationModel

    model = DurationModel(max_spread=2.0)
    model.observe("ann", "", 1, 600.0)
    assert model.predict("ann", "", 1, 36_000.0) is None  # one run says little
    model.observe("ann", "", 1, 1000.0)
    assert model.predict("ann", "", 1, 36_000.0) == pytest.approx((600.0 * 1000.0) ** 0.5)
    model.observe("ann", "", 1, 30_000.0)  # ten minutes one time, eight hours the next: the limit
    assert model.predict("ann", "", 1, 36_000.0) is None
    assert DurationModel().predict("ann", "", 1, 36_000.0) is None  # (no history at all)
    loose = DurationModel()
    for run in (600.0, 1000.0, 30_000.0):
        loose.observe("ann", "", 1, run)
    assert loose.predict("ann", "", 1, 36_000.0) == pytest.approx((600.0 * 1000.0 * 30_000.0) ** (1 / 3))
