"""The simulator on the small shared traces, through the same scheduler."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from builders import CORRAL_BY_GPUS
from corral.scheduler import Policy
from corral.sim.engine import cluster, loop_of, simulate
from corral.sim.trace import ROUND_LIMITS_S, TraceJob, load_trace, requested_limit

TRACES = Path(__file__).resolve().parent / "data" / "traces"  # small public traces kept in the repository
KEYS = {"jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s", "bounded_slowdown", "utilization",
        "makespan_s", "jain_fairness", "max_user_wait_s", "sched_cpu_s", "placements_per_cpu_s"}


def test_time_limits_over_estimate_and_round_up() -> None:
    rng = random.Random(1)
    for duration in (5.0, 700.0, 4000.0, 90000.0, 5e6):
        limit = requested_limit(duration, rng)
        assert duration <= limit <= max(10 * duration, ROUND_LIMITS_S[0]) + ROUND_LIMITS_S[-1]


@pytest.mark.parametrize("policy", ["fifo", "slurm", "corral"])
def test_replay_finishes_every_job_with_sane_metrics(policy: str) -> None:
    jobs = load_trace(TRACES / "tiresias-60.csv")
    result = simulate(jobs, cluster(2, 8), Policy.named(policy))
    metrics = result.metrics()
    assert KEYS <= set(metrics)
    assert metrics["jobs"] == 60 and metrics["unplaceable"] == 0
    assert 0 < metrics["utilization"] <= metrics["utilization_bound"] <= 1
    assert metrics["avg_wait_s"] >= 0 and metrics["bounded_slowdown"] >= 1
    for outcome in result.outcomes:
        assert outcome.start >= outcome.job.submit_s
        assert outcome.end - outcome.start == pytest.approx(outcome.job.duration_s)
    # GPUs are never overcommitted at any instant
    edges = sorted([(o.start, o.job.gpus) for o in result.outcomes] + [(o.end, -o.job.gpus) for o in result.outcomes],
                   key=lambda e: (e[0], e[1]))
    busy = 0
    for _, delta in edges:
        busy += delta
        assert busy <= 16


def test_backfill_policies_beat_strict_fifo_on_waits() -> None:
    jobs = load_trace(TRACES / "philly-gavel-4vc-head400.csv", limit=400)
    fifo = simulate(jobs, cluster(6, 8), Policy.named("fifo")).metrics()
    corral = simulate(jobs, cluster(6, 8), Policy.named("corral")).metrics()
    assert corral["avg_wait_s"] < fifo["avg_wait_s"] and corral["avg_jct_s"] < fifo["avg_jct_s"]


def test_sim_cli_json_is_deterministic() -> None:
    args = [sys.executable, "-m", "corral.cli.main", "sim", "--trace", str(TRACES / "tiresias-60.csv"),
            "--policy", "slurm", "--nodes", "2", "--json"]
    first, second = (json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
                     for _ in range(2))
    for key in ("sched_cpu_s", "placements_per_cpu_s"):
        first.pop(key), second.pop(key)
    assert first == second and first["policy"] == "slurm" and first["jobs"] == 60


def test_after_leaves_out_earlier_submissions() -> None:
    everything = load_trace(TRACES / "tiresias-60.csv")
    cut = everything[30].submit_s
    later = load_trace(TRACES / "tiresias-60.csv", after=cut)
    assert later and all(j.submit_s >= cut for j in later)
    assert len(later) == sum(1 for j in everything if j.submit_s >= cut)


def test_slurm_model_backfills_only_every_bf_interval_corral_on_every_event() -> None:
    """Slurm's main scheduler (every event) stops at the blocked 8-GPU job; the short 2-GPU
    job behind it starts at the next backfill pass. corral's loop runs a full cycle on the
    submission itself."""
    jobs = [TraceJob("a", "u", 0.0, 4, 100.0, 900.0), TraceJob("b", "u", 1.0, 8, 50.0, 900.0),
            TraceJob("c", "u", 2.0, 2, 10.0, 60.0)]
    starts = {}
    for name, bf in (("slurm", 30.0), ("corral", None)):
        result = simulate(jobs, cluster(1, 8), Policy.named(name), bf_interval_s=bf)
        starts[name] = {o.job.id: o.start for o in result.outcomes}
    assert starts["slurm"] == {"a": 0.0, "c": 30.0, "b": 100.0}
    assert starts["corral"] == {"a": 0.0, "c": 2.0, "b": 100.0}
    slow = simulate(jobs, cluster(1, 8), Policy.named("slurm"), bf_interval_s=45.0)
    assert {o.job.id: o.start for o in slow.outcomes}["c"] == 45.0


def test_with_the_expansion_factor_a_passed_over_gang_catches_up_within_its_limit() -> None:
    """A steady stream of 1-2 GPU jobs never leaves a node whole. Small-first alone lets it
    pass the 8-GPU gang until the stream ends; the expansion factor (waited / own limit,
    weighted 10000) lifts the gang above the stream within a fraction of its 15-minute
    limit, and it gets the reservation. Mean JCT still beats Slurm's large-first order."""
    jobs = [TraceJob(f"s{i}", "u", i * 10.0, 1 + (i % 3 == 0), 130.0, 900.0) for i in range(150)]
    jobs = sorted(jobs + [TraceJob("gang", "u", 205.0, 8, 120.0, 900.0)], key=lambda j: j.submit_s)
    plain = CORRAL_BY_GPUS  # small-first by GPUs: the 15-minute limits are all alike
    runs = {name: simulate(jobs, cluster(2, 8), policy, **loop_of(loop))
            for name, policy, loop in (("expansion", Policy.named("corral", weights=replace(plain.weights,
                                                                                            expansion=10000.0)), "corral"),
                                       ("slurm", Policy.named("slurm"), "slurm"), ("corral", plain, "corral"))}
    wait = {name: next(o.start - o.job.submit_s for o in r.outcomes if o.job.id == "gang") for name, r in runs.items()}
    assert wait["expansion"] <= 900 / 4
    assert wait["corral"] > 1200  # until the stream ends at t=1490
    assert runs["expansion"].metrics()["avg_jct_s"] < runs["slurm"].metrics()["avg_jct_s"]


def test_usage_is_charged_as_it_accrues_or_at_slurms_passes() -> None:
    # user a: a 30-s job at t=0 and a 200-s one at t=10; a pass every 60 s (PriorityCalcPeriod)
    jobs = [TraceJob("short", "a", 0.0, 1, 30.0, 60.0), TraceJob("long", "a", 10.0, 2, 200.0, 300.0),
            TraceJob("late", "b", 400.0, 1, 10.0, 60.0)]
    nodes, policy, day = cluster(1, 8), Policy.named("slurm"), 1e12  # no decay to speak of
    exact = simulate(jobs, nodes, policy, half_life_s=day).usage
    # every GPU-second, the short job's too (it ends at an event, and is charged up to it)
    assert exact[("a", "a")] == pytest.approx(30 * 1 + 200 * 2)
    passes = simulate(jobs, nodes, policy, half_life_s=day, usage_every_s=60.0).usage
    # Slurm's rule: the short job ended between passes and is never charged; the long one
    # (t = 10-210) is charged at the passes of t = 60, 120, 180 only: 50 + 60 + 60 s
    assert passes[("a", "a")] == pytest.approx(2 * (50 + 60 + 60))


def _sim_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corral.cli.main", "sim", *args], capture_output=True, text=True)


def test_sim_takes_a_sites_scheduler_settings_from_its_config(tmp_path: Path) -> None:
    trace = ["--trace", str(TRACES / "tiresias-60.csv"), "--nodes", "2", "--json"]
    config = tmp_path / "config.yaml"
    config.write_text("scheduler:\n  policy: fifo\n")
    via_config = json.loads(_sim_cli(*trace, "--config", str(config)).stdout)
    fifo = json.loads(_sim_cli(*trace, "--policy", "fifo").stdout)
    corral = json.loads(_sim_cli(*trace).stdout)
    for run in (via_config, fifo, corral):
        run.pop("sched_cpu_s"), run.pop("placements_per_cpu_s")
    assert via_config == fifo and via_config["policy"] == "fifo"
    assert corral["avg_jct_s"] != fifo["avg_jct_s"]  # so the equality above says something

    both = _sim_cli(*trace, "--config", str(config), "--policy", "slurm")
    assert both.returncode == 2 and "not both" in both.stderr


def test_sim_refuses_a_bad_config_naming_field_and_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("scheduler:\n  policy: corral\n  size_by: area\n")
    run = _sim_cli("--trace", str(TRACES / "tiresias-60.csv"), "--config", str(config))
    assert run.returncode == 1 and run.stdout == ""
    assert f"{config}:3" in run.stderr and "scheduler.size_by" in run.stderr


def test_sim_charges_the_account_a_sites_tree_puts_a_user_in(tmp_path: Path) -> None:
    from corral.site import load_site

    config = tmp_path / "config.yaml"
    config.write_text("accounts:\n  - name: team\n    users: [a, b]\n")
    site = load_site(config)
    # one GPU: a's long job runs first; b and c then ask at the same instant. Alone in their
    # accounts they tie on fair share and b (submitted first) goes first; once a's usage is
    # charged to the account b shares with a, c's fair share is higher and c goes first.
    jobs = [TraceJob("a1", "a", 0.0, 1, 1000.0, 2000.0), TraceJob("b1", "b", 1.0, 1, 100.0, 200.0),
            TraceJob("c1", "c", 1.0, 1, 100.0, 200.0)]
    policy = Policy.named("corral")
    starts = {}
    for name, account_of in (("own", None), ("site", site.account_of)):
        result = simulate(jobs, cluster(1, 1), policy, account_of=account_of)
        starts[name] = {o.job.id: o.start for o in result.outcomes}
        if account_of is not None:
            assert set(result.usage) == {("team", "a"), ("team", "b"), ("c", "c")}
    assert starts["own"]["b1"] < starts["own"]["c1"]
    assert starts["site"]["c1"] < starts["site"]["b1"]
