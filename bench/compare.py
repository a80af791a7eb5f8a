#!/usr/bin/env python3
"""One benchmark, run on two or more checkouts of corral alternately in one session, so a
noisy machine (2 cores shared with other work) weighs on each the same: prints every
round's figures, then each figure's median over the rounds and its ratio to the first
checkout's.

  python bench/compare.py --bench launch --rounds 3 \\
      --checkout old=/work/bench-old:/tmp/venv-old/bin/python --checkout new=.:/tmp/venv-perf/bin/python \\
      -- --n 300 --latency-samples 30

A checkout is ``LABEL=DIR[:PYTHON]``: its own ``bench/BENCH.py`` runs under PYTHON (default:
this interpreter) with ``PYTHONPATH=DIR``, so the server it starts (``python -m
corral.server``) imports that checkout's code whatever the interpreter's own install. What
follows ``--`` goes to the benchmark. Benchmarks whose figures land in
``bench/results/NAME.json`` of their checkout (submit, ray, slurm_group) are read from there;
launch and recovery print ``--json``. ``--out FILE`` keeps every round as JSON."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _launch(out: str, root: Path) -> dict[str, float]:
    c = json.loads(out)["corral"]
    return {"one task, submit -> running p50 (ms)": _median(c["latency_one"]) * 1000,
            "4-task group, submit -> all running p50 (ms)": _median(c["latency_group"]) * 1000,
            "`corral launch -d` p50 (ms)": _median(c["latency_cli"]) * 1000,
            "trivial jobs end to end (jobs/s)": c["throughput"]["complete_per_s"],
            "trivial jobs submitted (/s)": c["throughput"]["submit_per_s"]}


def _recovery(out: str, root: Path) -> dict[str, float]:
    r = json.loads(out)
    return {"kill -9 -> RUNNING again p50 (ms)": _median(r["to_running_s"]) * 1000,
            "kill -9 -> READY again p50 (ms)": _median(r["to_ready_s"]) * 1000,
            "same identity, peers untouched (all)": float(all(r["same_identity"]) and all(r["peers_untouched"]))}


def _submit(out: str, root: Path) -> dict[str, float]:
    figures = {}
    for r in json.loads((root / "bench" / "results" / "submit.json").read_text())["results"]:
        figures[f"{r['system']}: accepted/s"] = float(r["accepted_per_s"])
        figures[f"{r['system']}: p50 (ms)"] = float(r["p50_ms"])
    return figures


def _ray(out: str, root: Path) -> dict[str, float]:
    r = json.loads((root / "bench" / "results" / "ray.json").read_text())
    ours, theirs = _median(r["group_s"]), _median(r["group_baseline_s"])
    return {"RL group on Ray, submit -> all running p50 (ms)": ours * 1000,
            "same group hand-written in Ray p50 (ms)": theirs * 1000,
            "corral / hand-written (group)": ours / theirs,
            "one-GPU jobs on Ray end to end (jobs/s)": r["jobs"] / r["jobs_s"],
            "killed worker -> RUNNING elsewhere (s)": r["recovery_s"]}


def _slurm_group(out: str, root: Path) -> dict[str, float]:
    r = json.loads((root / "bench" / "results" / "slurm_group.json").read_text())
    return {"RL group on Slurm, submit -> all up (s)": r["corral_up_s"],
            "hand-written hetjob, submit -> all up (s)": r["by_hand_up_s"],
            "corral / hand-written": r["ratio_corral_over_hand"]}


READERS: dict[str, tuple[list[str], Callable[[str, Path], dict[str, float]]]] = {
    "launch": (["--json"], _launch),
    "recovery": (["--json"], _recovery),
    "submit": ([], _submit),
    "ray": ([], _ray),
    "slurm_group": ([], _slurm_group),
}


def checkout(text: str) -> tuple[str, Path, str]:
    label, sep, rest = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"--checkout {text!r}: expected LABEL=DIR[:PYTHON]")
    directory, _, python = rest.partition(":")
    root = Path(directory).resolve()
    if not (root / "corral").is_dir():
        raise argparse.ArgumentTypeError(f"--checkout {text!r}: {root} holds no corral package")
    return label, root, python or sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, choices=sorted(READERS))
    parser.add_argument("--checkout", type=checkout, action="append", required=True,
                        help="LABEL=DIR[:PYTHON]; the first is the baseline of the ratios")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write every round's figures here (JSON)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the benchmark's own arguments")
    args = parser.parse_args()
    if len(args.checkout) < 2:
        parser.error("--checkout: give at least two, to compare")
    extra, reader = READERS[args.bench]
    bench_args = [a for a in args.args if a != "--"] + extra
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in args.checkout}
    for n in range(args.rounds):
        order = args.checkout if n % 2 == 0 else list(reversed(args.checkout))  # neither always goes first
        for label, root, python in order:
            env = dict(os.environ, PYTHONPATH=str(root))
            done = subprocess.run([python, str(root / "bench" / f"{args.bench}.py"), *bench_args], env=env,
                                  capture_output=True, text=True, cwd=root)
            if done.returncode != 0:
                sys.exit(f"{label}: bench/{args.bench}.py exited {done.returncode}:\n{done.stderr[-3000:]}")
            figures = reader(done.stdout, root)
            rounds[label].append(figures)
            print(f"round {n + 1} {label}: " + "; ".join(f"{k} {v:.4g}" for k, v in figures.items()), flush=True)
    base = args.checkout[0][0]
    keys = list(rounds[base][0])
    print(f"\nmedians over {args.rounds} rounds (ratio: / {base})")
    print("| figure | " + " | ".join(label for label, _, _ in args.checkout) + " | " +
          " | ".join(f"{label} / {base}" for label, _, _ in args.checkout[1:]) + " |")
    print("| --- " * (2 * len(args.checkout)) + "|")
    for key in keys:
        medians = {label: _median([r[key] for r in rs if key in r]) for label, rs in rounds.items()}
        ratios = [f"{medians[label] / medians[base]:.2f}x" if medians[base] else "-" for label, _, _ in args.checkout[1:]]
        print(f"| {key} | " + " | ".join(f"{medians[label]:.4g}" for label, _, _ in args.checkout) + " | " +
              " | ".join(ratios) + " |")
    if args.out:
        args.out.write_text(json.dumps({"bench": args.bench, "args": bench_args, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
