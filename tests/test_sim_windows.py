"""bench/sim_windows.py, the scheduling study on trace windows: its window syntax, its
verdict against the study's targets, and a short run on tiresias-60's two halves that
writes its table, its results JSON and one PNG per window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import sim_windows  # noqa: E402

# the small copies of the public traces kept in the repository (a bare clone has no others)
TRACES = {**os.environ, "CORRAL_TRACES_DIR": str(ROOT / "tests" / "data" / "traces")}


def test_weeks_and_explicit_windows() -> None:
    week = sim_windows.parse_window("pollux:w10")
    assert (week.trace, week.after, week.before, week.gpus_per_node) == ("pollux", 70 * 86400.0, 77 * 86400.0, 8)
    explicit = sim_windows.parse_window("alibaba:1e6..1.2e7")
    # an Alibaba window never reaches back into its resident pods
    assert (explicit.after, explicit.before, explicit.gpus_per_node) == (9.9e6, 1.2e7, 4)
    for bad, says in (("nowhere:w1", "TRACE one of"), ("pollux:q3", "WHICH is"), ("4vc:5..5", "empty")):
        with pytest.raises(ValueError, match=says):
            sim_windows.parse_window(bad)


def test_the_verdict_takes_the_ratio_of_the_seeds_means_and_counts_seeds() -> None:
    def m(wait, p99, slow, worst, util, over):
        return {"avg_wait_s": wait, "p99_wait_s": p99, "bounded_slowdown": slow, "max_user_wait_s": worst,
                "utilization": util, "utilization_in_window": util, "jct_over_floor": over}

    slurm = {0: m(100, 1000, 10, 200, 0.7, 1.5), 1: m(300, 1000, 10, 200, 0.7, 1.5)}
    corral = {0: m(20, 400, 2, 100, 0.7, 1.01), 1: m(200, 600, 4, 160, 0.69, 1.03)}
    v = sim_windows.verdict(corral, slurm)
    assert v["seeds"] == 2
    assert v["avg_wait_s"] == {"ratio": 0.55, "bound": 0.5, "seeds_met": 1}  # 110 / 200; seed 0 alone ≤ 0.5
    assert v["p99_wait_s"]["ratio"] == 0.5 and v["p99_wait_s"]["seeds_met"] == 1
    assert v["bounded_slowdown"]["ratio"] == 0.3 and v["bounded_slowdown"]["seeds_met"] == 1  # 0.2, 0.4
    assert v["max_user_wait_s"]["ratio"] == 0.65
    assert v["utilization"] == {"difference": -0.005, "seeds_met": 1}
    assert v["jct_over_floor"] == {"value": 1.02, "bound": 1.02, "seeds_met": 1}


def test_a_short_study_writes_its_table_results_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "sim_windows.py"), "--windows",
                          "tiresias:h1,tiresias:h2", "--seeds", "0,1", "--plot", str(tmp_path / "plots"),
                          "--out", str(out)], capture_output=True, text=True, timeout=300, env=TRACES)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert [w["key"] for w in record["windows"]] == ["tiresias:h1", "tiresias:h2"]
    assert sum(w["jobs"] for w in record["windows"]) == 60  # the halves split the trace, no job lost or doubled
    assert all(0 < w["offered_load"] <= 0.9 for w in record["windows"])
    assert len(record["runs"]) == 2 * 2 * 3 and set(record["verdicts"]) == {"tiresias:h1 corral", "tiresias:h2 corral"}
    rows = [line for line in run.stdout.splitlines() if line.startswith("|  | corral |")]
    assert len(rows) == 2
    for name in ("tiresias-h1.png", "tiresias-h2.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "sim_windows.py"), "--seeds", "x"],
                         capture_output=True, text=True, env=TRACES)
    assert bad.returncode == 2 and "--seeds" in bad.stderr


def test_reuse_takes_the_built_in_rows_from_an_earlier_run_instead_of_replaying(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    args = [sys.executable, str(ROOT / "bench" / "sim_windows.py"), "--windows", "tiresias:h1", "--seeds", "0",
            "--policies", "slurm,corral"]
    done = subprocess.run([*args, "--out", str(first)], capture_output=True, text=True, timeout=300, env=TRACES)
    assert done.returncode == 0, done.stderr
    again = subprocess.run([*args, "--reuse", str(first), "--out", str(second)], capture_output=True, text=True,
                           timeout=300, env=TRACES)
    assert again.returncode == 0, again.stderr
    assert "2 rows taken from" in again.stderr and "0 replays" in again.stderr
    # listed in the order asked for, not as the replays ended (which a loaded machine reorders)
    assert [r["policy"] for r in json.loads(first.read_text())["runs"]] == ["slurm", "corral"]
    assert json.loads(second.read_text())["runs"] == json.loads(first.read_text())["runs"]
    # another load sizes other clusters: nothing is taken
    other = subprocess.run([*args, "--load", "0.5", "--reuse", str(first), "--out", str(second)],
                           capture_output=True, text=True, timeout=300, env=TRACES)
    assert "0 rows taken from" in other.stderr and "2 replays" in other.stderr
