"""``corral sim`` as a study reads it: several policies side by side with their ratios to the
slurm model, a window of a trace (``--after`` / ``--before``), the plot (a real PNG), and bad
option values refused naming the option. In-process through click's runner, on the small
traces kept in tests/data/traces."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.sim import sim
from corral.sim.trace import load_trace

TRACES = Path(__file__).resolve().parent / "data" / "traces"
TIRESIAS = str(TRACES / "tiresias-60.csv")
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str):
    return CliRunner().invoke(sim, ["--trace", TIRESIAS, "--nodes", "2", *args], catch_exceptions=False)


def test_two_policies_side_by_side_with_ratios_to_slurm() -> None:
    out = run("--policy", "slurm,corral", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    slurm, corral = report["runs"]
    assert (slurm["policy"], corral["policy"]) == ("slurm", "corral")
    assert report["gpus"] == 16 and slurm["jobs"] == corral["jobs"] == 60
    ratio = report["vs_slurm"]["corral"]
    assert ratio["avg_wait_s"] == round(corral["avg_wait_s"] / slurm["avg_wait_s"], 4)
    assert ratio["utilization"] == round(corral["utilization"] / slurm["utilization"], 4)
    assert slurm["avg_wait_s"] != corral["avg_wait_s"]  # so the ratio says something
    # the same run one at a time gives the same numbers (repeating --policy works as a list)
    alone = json.loads(run("--policy", "corral", "--json").output)
    for m in (alone, corral):
        m.pop("sched_cpu_s"), m.pop("placements_per_cpu_s")
    assert alone == corral
    text = run("--policy", "fifo", "--policy", "slurm,corral").output
    header = next(line for line in text.splitlines() if "corral/slurm" in line).split()
    assert header == ["fifo", "slurm", "corral", "fifo/slurm", "corral/slurm"]
    wait_row = next(line for line in text.splitlines() if line.startswith("avg_wait_s")).split()
    assert wait_row[-1] == f"{ratio['avg_wait_s']:.3f}"
    assert "mean wait per user (s)" in text


def test_one_policy_prints_the_floor_and_each_users_wait() -> None:
    trace = str(TRACES / "philly-gavel-4vc-head400.csv")
    out = CliRunner().invoke(sim, ["--trace", trace, "--nodes", "6", "--policy", "slurm"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    floor = next(line.split() for line in lines if line.startswith("jct_floor_s"))
    # the floor is over the jobs that ran: a 64-GPU job never fits 6 × 8 GPUs
    jobs = [j for j in load_trace(TRACES / "philly-gavel-4vc-head400.csv") if j.gpus <= 48]
    assert next(line.split() for line in lines if line.startswith("jobs")) == ["jobs", str(len(jobs))]
    assert float(floor[1]) == pytest.approx(sum(j.duration_s for j in jobs) / len(jobs), abs=0.1)
    users = lines[lines.index(next(line for line in lines if line.startswith("mean wait per user"))) + 2:]
    assert {u.split()[0] for u in users} == {j.user for j in jobs}
    waits = [float(u.split()[1].replace(",", "")) for u in users]
    assert waits == sorted(waits, reverse=True)


def test_plot_of_two_policies_is_a_real_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "out.png"
    out = run("--policy", "slurm,corral", "--plot", str(path))
    assert out.exit_code == 0, out.output
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 20_000  # four drawn panels, not an empty canvas
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1300, 900)
    assert f"plot: {path}" in out.output


def test_before_replays_a_window_of_the_trace() -> None:
    # tiresias-60's jobs arrive at 0, 30, 53 …; 311 and 892 are two of its submit times
    out = run("--after", "311", "--before", "892", "--policy", "slurm", "--json")
    assert out.exit_code == 0, out.output
    window = json.loads(out.output)
    expected = [j for j in load_trace(Path(TIRESIAS)) if 311 <= j.submit_s < 892]
    assert window["jobs"] == len(expected) == 19  # the job at 892 is out, the one at 311 in
    assert window["jct_floor_s"] == round(sum(j.duration_s for j in expected) / 19, 1)
    # the load is over the window's span, 581 s, on 16 GPUs
    assert window["offered_load"] == round(sum(j.gpus * j.duration_s for j in expected) / (581 * 16), 4)
    everything = json.loads(run("--policy", "slurm", "--json").output)
    before_only = json.loads(run("--before", "892", "--policy", "slurm", "--json").output)
    assert everything["jobs"] == 60 and before_only["jobs"] == 30


@pytest.mark.parametrize("args, option, says", [
    (("--policy", "slurm,lottery"), "--policy", "'lottery' is not one of fifo, slurm, corral"),
    (("--after", "500", "--before", "500"), "--before", "not later than --after"),
    (("--before", "nan"), "--before", "finite"),
    (("--after", "inf"), "--after", "finite"),
    (("--nodes", "0"), "--nodes", "0"),
    (("--limit", "0"), "--limit", "0"),
    (("--plot", "/nonexistent-dir/out.png"), "--plot", "does not exist"),
    (("--plot", "out.notaformat"), "--plot", ".png"),
])
def test_bad_option_values_are_refused_naming_the_option(args: tuple, option: str, says: str) -> None:
    if args[0] == "--plot":
        pytest.importorskip("matplotlib")
    out = run(*args)
    assert out.exit_code == 2 and option in out.output and says in out.output, out.output


def test_a_window_with_no_job_says_so() -> None:
    out = run("--after", "1e9")
    assert out.exit_code == 1 and "no job of tiresias-60.csv was submitted in [1e+09, …)" in out.output


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed: importing it fails
    out = run("--plot", str(tmp_path / "out.png"))
    assert out.exit_code == 2 and "--plot" in out.output and "pip install 'corral[plot]'" in out.output
    assert not (tmp_path / "out.png").exists()
