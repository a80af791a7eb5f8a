"""The simulator's study metrics on a hand-built replay whose every number is worked out by
hand (waits, their median and tail, the JCT floor, bounded slowdown, per-user waits, GPUs
in use and utilisation while jobs arrive), the ratios to a baseline, and the window helpers
(cut, offered load, cluster sizing)."""

from __future__ import annotations

import pytest

from corral.scheduler.plan import Allocation
from corral.sim.results import Hold, Outcome, SimResult, ratios
from corral.sim.trace import TraceJob
from corral.sim.window import cut, in_window_load, nodes_for, offered_load, span

# (id, user, submit, run time, start): one GPU each, no preemption
JOBS = [("a", "u1", 0.0, 100.0, 0.0), ("b", "u1", 0.0, 50.0, 100.0), ("c", "u2", 10.0, 5.0, 30.0),
        ("d", "u2", 20.0, 200.0, 150.0), ("e", "u3", 0.0, 1000.0, 0.0)]


def replay(record: bool = True, total_gpus: int = 4) -> SimResult:
    outcomes, holds = [], []
    for k, (name, user, submit, run, start) in enumerate(JOBS):
        job = TraceJob(name, user, submit, 1, run, 3600.0)
        outcomes.append(Outcome(job, start, start + run, gpu_s=run))
        holds.append(Hold(k, Allocation("main", 0, "n0", (k % total_gpus,), 0.0, 0.0), start, start + run))
    return SimResult(outcomes, total_gpus, 0.5, len(JOBS), 0, 10, lost_gpu_s=50.0, holds=holds if record else [])


def test_waits_and_their_median_and_tail() -> None:
    result = replay()
    assert result.waits() == [0.0, 100.0, 20.0, 130.0, 0.0]
    m = result.metrics()
    assert m["avg_wait_s"] == 50.0  # 250 / 5
    assert m["p50_wait_s"] == 20.0  # sorted 0, 0, 20, 100, 130
    assert m["p99_wait_s"] == 130.0


def test_jct_beside_its_zero_wait_floor() -> None:
    m = replay().metrics()
    # JCTs 100, 150, 25, 330, 1000; had nobody waited, the run times 100, 50, 5, 200, 1000
    assert m["avg_jct_s"] == 321.0
    assert m["jct_floor_s"] == 271.0
    assert m["jct_over_floor"] == round(321 / 271, 4) == 1.1845


def test_bounded_slowdown_counts_short_jobs_as_ten_seconds() -> None:
    result = replay()
    # c ran 5 s after 20 s of wait: 25 / max(5, 10) = 2.5, not 25 / 5
    assert result.slowdowns() == [1.0, 3.0, 2.5, 1.65, 1.0]
    m = result.metrics()
    assert m["bounded_slowdown"] == pytest.approx(9.15 / 5, abs=1e-3)
    assert m["p99_bounded_slowdown"] == 3.0


def test_each_users_mean_wait_the_worst_first() -> None:
    m = replay().metrics()
    assert m["user_mean_wait_s"] == {"u2": 75.0, "u1": 50.0, "u3": 0.0}
    assert list(m["user_mean_wait_s"]) == ["u2", "u1", "u3"]
    assert (m["max_user_wait_s"], m["max_wait_user"]) == (75.0, "u2")


def test_gpus_in_use_and_utilisation_while_jobs_arrive() -> None:
    result = replay()
    times, gpus = result.gpus_in_use()
    assert times == [0.0, 30.0, 35.0, 100.0, 150.0, 350.0, 1000.0]
    assert gpus == [2, 3, 2, 2, 2, 1, 0]  # at 100 and 150 one job ends as the next starts
    m = result.metrics()
    # jobs arrive over [0, 20]: a and e hold a GPU each throughout, of 4
    assert m["utilization_in_window"] == 0.5
    # over the makespan (0 to 1000): 1355 GPU-seconds of 4000
    assert m["utilization"] == round(1355 / 4000, 4)
    assert m["lost_gpu_s"] == 50.0 and m["lost_gpu_share"] == round(50 / 1355, 4)


def test_without_recorded_holds_there_is_no_curve_nor_in_window_utilisation() -> None:
    result = replay(record=False)
    assert result.gpus_in_use() == ([], [])
    m = result.metrics()
    assert m["utilization_in_window"] is None
    assert m["avg_wait_s"] == 50.0  # the rest does not need them


def test_the_keys_other_code_reads_are_kept() -> None:
    m = replay().metrics()
    assert {"jobs", "unplaceable", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s",
            "bounded_slowdown", "utilization", "utilization_bound", "makespan_s", "jain_fairness", "max_user_wait_s",
            "sched_cpu_s", "placements_per_cpu_s", "cycles", "cancelled", "preemptions", "requeues", "shrinks",
            "lost_gpu_s"} <= set(m)
    assert SimResult([], 8, 0.0, 0, 0, 0).metrics()["jobs"] == 0


def test_ratios_to_a_baseline_leave_out_what_the_baseline_did_not_have() -> None:
    mine = {"avg_wait_s": 30.0, "p99_wait_s": 0.0, "utilization": 0.8, "max_user_wait_s": None}
    base = {"avg_wait_s": 60.0, "p99_wait_s": 0.0, "utilization": 0.5, "max_user_wait_s": 10.0}
    r = ratios(mine, base, ("avg_wait_s", "p99_wait_s", "utilization", "max_user_wait_s", "absent"))
    assert r == {"avg_wait_s": 0.5, "p99_wait_s": None, "utilization": 1.6, "max_user_wait_s": None, "absent": None}


def job(name: str, submit: float, gpus: int, run: float) -> TraceJob:
    return TraceJob(name, "u", submit, gpus, run, 3600.0)


def test_a_window_and_the_load_it_offers() -> None:
    jobs = [job("x", 0.0, 4, 50.0), job("y", 50.0, 2, 500.0), job("z", 100.0, 8, 10.0)]
    window = cut(jobs, 100.0)  # [.., 100): z, submitted at 100, is out
    assert [j.id for j in window] == ["x", "y"]
    assert cut(jobs, None) == jobs
    assert span(window, 0.0, 100.0) == 100.0 and span(window) == 50.0
    # 4 × 50 + 2 × 500 GPU-seconds over 100 s on 8 GPUs
    assert offered_load(window, 8, 0.0, 100.0) == 1.5
    # y could only have run 50 s of its 500 before the window closed
    assert in_window_load(window, 8, 0.0, 100.0) == (200 + 100) / 800
    assert offered_load([], 8, 0.0, 100.0) == 0.0


def test_a_cluster_sized_for_a_load_holds_the_widest_job() -> None:
    window = [job("x", 0.0, 4, 50.0), job("y", 50.0, 2, 500.0)]  # 12 GPUs asked for on average over [0, 100)
    nodes = nodes_for(window, 4, 0.75, 0.0, 100.0)
    assert nodes == 4 and offered_load(window, 16, 0.0, 100.0) <= 0.75 < offered_load(window, 12, 0.0, 100.0)
    # a light window still gets a node per 8 GPUs of its widest (16-GPU) job
    assert nodes_for([job("w", 0.0, 16, 1.0)], 8, 0.9, 0.0, 1000.0) == 2
    with pytest.raises(ValueError, match="load"):
        nodes_for(window, 4, 0.0)
