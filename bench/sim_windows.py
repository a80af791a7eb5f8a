#!/usr/bin/env python3
"""The scheduling study on windows of the public traces: ``fifo``, ``slurm`` (the model of a
typical Slurm site: main scheduler on every event, backfill every 30 s) and ``corral`` (a
full cycle on every event, as its control loop runs), each window on a cluster sized for its
offered load, over several seeds of the users' time-limit over-estimates.

  python bench/sim_windows.py [--windows pollux:w10,pollux:w13,4vc:h1,4vc:h2,alibaba:h1,alibaba:h2]
                              [--seeds 0,1,2,3,4] [--load 0.9] [--workers 2] [--plot DIR]
                              [--policies fifo,slurm,corral | --no-baselines]
                              [--variant LABEL=config.yaml ...] [--elastic FRACTION] [--out NAME.json]
                              [--reuse EARLIER.json]

A window is ``TRACE:wN`` (the jobs submitted in week N, [7N d, 7N + 7 d) of the trace),
``TRACE:h1`` / ``TRACE:h2`` (the first or second half of the trace's submission span) or
``TRACE:A..B`` (submitted in [A, B) seconds). The Alibaba trace's windows start after its 24
resident pods (9.9e6 s). Each window's cluster is the fewest nodes (8 GPUs; 4 for Alibaba)
keeping its offered load, sum(GPUs × run time) / (span × GPUs), at or under ``--load``. A
window starts on an empty cluster and is replayed until its last job ends.

Prints per window one row per policy (means over the seeds): mean, p50 and p99 wait,
bounded slowdown (mean, p99), mean JCT beside its zero-wait floor (the mean run time: what
the mean JCT would be had no job waited), utilisation over the makespan and while jobs
arrive, the worst user's mean wait, preemptions and the GPU-hours they lost. Then each
policy's ratios to ``slurm`` against the study's targets: mean wait ≤ 0.5, p99 wait ≤ 0.5,
bounded slowdown ≤ 0.3, worst user's mean wait ≤ 0.75 (each the ratio of the seeds' means,
with how many seeds hold it), utilisation not lower, mean JCT within 2 % of its floor.

``--elastic FRACTION`` marks that share of the multi-GPU jobs (chosen by seed) elastic, as
``num_nodes: {min: gpus/2, max: 2 x gpus, grow: true}`` would (trace columns ``min_gpus``,
``max_gpus``: one-GPU replicas, a pace linear in the GPUs held, grown GPUs at 0.9), the same
jobs for every row, and adds the row ``corral+grow``: corral with growth into idle GPUs on;
every other row has it off (Slurm has no such thing), so ``corral`` beside ``corral+grow`` is
what growth alone changes.

``--variant LABEL=config.yaml`` adds a row for a site config (its scheduler section and
account tree, as ``corral sim --config`` reads them), judged against slurm like corral.
``--plot DIR`` writes DIR/WINDOW.png per window (the first seed): wait and bounded-slowdown
CDFs, GPUs in use over time and each user's mean wait, one curve per policy. Results go to
bench/results/sim_windows.json (sim_windows_variants.json with variants; ``--out`` names
another file). ``--reuse EARLIER.json`` takes the built-in rows (fifo, slurm, corral) from an
earlier results file where it has them for the same window, cluster size and seed (a replay is
deterministic), so a variant is judged against them without replaying them."""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from functools import lru_cache
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corral.scheduler import Policy  # noqa: E402
from corral.sim.engine import cluster, loop_of, simulate  # noqa: E402
from corral.sim.results import ratios  # noqa: E402
from corral.sim.trace import TraceJob, load_trace  # noqa: E402
from corral.sim.window import cut, in_window_load, nodes_for, offered_load  # noqa: E402
from corral.site import load_site  # noqa: E402
from corral.spec import SpecError  # noqa: E402
from corral.spec.quantity import parse_duration  # noqa: E402

# the shared public traces beside the checkout; CORRAL_TRACES_DIR names another directory (the tests
# point it at their small copies in tests/data/traces)
TRACES_DIR = Path(os.environ.get("CORRAL_TRACES_DIR") or ROOT.parent / "shared" / "traces")
DAY = 86400.0
# key: (file, GPUs per node, where its windows may start, name)
TRACES = {
    "pollux": ("philly-pollux.csv", 8, None, "philly-pollux"),
    "4vc": ("philly-gavel-4vc.csv", 8, None, "philly-gavel-4vc"),
    "0e4a51": ("philly-gavel-0e4a51.csv", 8, None, "philly-gavel-0e4a51"),
    "alibaba": ("alibaba-pai-v2023.csv", 4, 9.9e6, "alibaba-pai-v2023"),  # after its 24 resident pods
    "tiresias": ("tiresias-60.csv", 8, None, "tiresias-60"),
}
DEFAULT_WINDOWS = "pollux:w10,pollux:w13,4vc:h1,4vc:h2,alibaba:h1,alibaba:h2"
BUILT_IN = ("fifo", "slurm", "corral")
BASELINE = "slurm"
# the study's targets for a policy against slurm: (metric, bound on the ratio of the seeds' means)
TARGETS = (("avg_wait_s", 0.5), ("p99_wait_s", 0.5), ("bounded_slowdown", 0.3), ("max_user_wait_s", 0.75))
FLOOR_SLACK = 1.02  # mean JCT within 2 % of its zero-wait floor
SHOWN = ("avg_wait_s", "p50_wait_s", "p99_wait_s", "bounded_slowdown", "p99_bounded_slowdown", "avg_jct_s",
         "jct_floor_s", "jct_over_floor", "utilization", "utilization_in_window", "max_user_wait_s", "preemptions",
         "lost_gpu_s", "sched_cpu_s")


@dataclass(frozen=True)
class Window:
    key: str  # as given: pollux:w10
    trace: str  # TRACES key
    after: float
    before: float
    nodes: int = 0
    gpus_per_node: int = 8
    jobs: int = 0
    users: int = 0
    offered_load: float = 0.0
    in_window_load: float = 0.0

    def label(self) -> str:
        name = TRACES[self.trace][3]
        return (f"{name} {self.key.partition(':')[2]} ([{self.after:.4g}, {self.before:.4g}) s; {self.jobs:,} jobs, "
                f"{self.users} users; {self.nodes} × {self.gpus_per_node} GPUs, load {self.offered_load:.2f})")


def submits(file: str) -> list[float]:
    with open(TRACES_DIR / file, newline="") as fh:
        return [float(row["submit_s"]) for row in csv.DictReader(fh)]


def parse_window(text: str) -> Window:
    trace, sep, which = text.partition(":")
    if not sep or trace not in TRACES:
        raise ValueError(f"{text!r}: expected TRACE:WHICH with TRACE one of {', '.join(TRACES)}")
    file, gpn, start, _ = TRACES[trace]
    if m := re.fullmatch(r"w(\d+)", which):
        week = int(m.group(1))
        after, before = week * 7 * DAY, (week + 1) * 7 * DAY
    elif which in ("h1", "h2"):
        times = [t for t in submits(file) if start is None or t >= start]
        first, last = min(times), max(times)
        middle = first + (last - first) / 2
        after, before = (first, middle) if which == "h1" else (middle, last + 1.0)
    elif m := re.fullmatch(r"([0-9.eE+]+)\.\.([0-9.eE+]+)", which):
        after, before = float(m.group(1)), float(m.group(2))
    else:
        raise ValueError(f"{text!r}: WHICH is wN (week N), h1 or h2 (half of the trace), or A..B (seconds)")
    if start is not None:
        after = max(after, start)
    if not before > after:
        raise ValueError(f"{text!r}: the window [{after:g}, {before:g}) is empty")
    return Window(text, trace, after, before, gpus_per_node=gpn)


@lru_cache(maxsize=4)
def window_jobs(trace: str, after: float, before: float, seed: int) -> tuple[TraceJob, ...]:
    return tuple(cut(load_trace(TRACES_DIR / TRACES[trace][0], None, seed, after), before))


def sized(window: Window, load: float) -> Window:
    jobs = list(window_jobs(window.trace, window.after, window.before, 0))  # run times do not depend on the seed
    if not jobs:
        raise ValueError(f"{window.key}: no job was submitted in [{window.after:g}, {window.before:g})")
    nodes = nodes_for(jobs, window.gpus_per_node, load, window.after, window.before)
    gpus = nodes * window.gpus_per_node
    return Window(window.key, window.trace, window.after, window.before, nodes, window.gpus_per_node, len(jobs),
                  len({j.user for j in jobs}), round(offered_load(jobs, gpus, window.after, window.before), 4),
                  round(in_window_load(jobs, gpus, window.after, window.before), 4))


def checkpointing(jobs: list[TraceJob], assumed: tuple[float, float, float] | None) -> list[TraceJob]:
    """The public traces say nothing of checkpoints: with ``--checkpointing OVER,EVERY,COST``
    every job running longer than OVER is taken to checkpoint every EVERY and to spend COST
    on each restart (a documented assumption, the same for every row)."""
    if assumed is None:
        return jobs
    over, every, cost = assumed
    return [replace(j, checkpoint_s=every, restart_cost_s=cost) if j.duration_s > over and j.checkpoint_s is None
            else j for j in jobs]


GROW_ROW = "corral+grow"


def elastic(jobs: list[TraceJob], fraction: float | None, seed: int) -> list[TraceJob]:
    """With ``--elastic FRACTION``: that share of the multi-GPU jobs (drawn per job id and
    seed, the same for every row) elastic from half their GPUs to twice them."""
    if not fraction:
        return jobs
    return [replace(j, min_gpus=max(1, j.gpus // 2), max_gpus=2 * j.gpus)
            if j.gpus >= 2 and random.Random(f"{seed}:{j.id}").random() < fraction else j for j in jobs]


def run(args: tuple) -> tuple[str, str, int, dict, object, float, float]:
    window, policy, seed, config, curves, assumed, fraction = args
    jobs = checkpointing(list(window_jobs(window.trace, window.after, window.before, seed)), assumed)
    jobs = elastic(jobs, fraction, seed)
    site_kwargs: dict = {}
    if config is not None:  # a variant: the site's policy, as `corral sim --config` runs it
        named, site_kwargs = load_site(Path(config)).replay(("leaf",))
    else:
        named = Policy.named("corral" if policy == GROW_ROW else policy, topology=("leaf",))
    if fraction:  # growth is what the corral+grow row alone has
        named = replace(named, grow=policy == GROW_ROW)
    started, cpu = time.time(), time.process_time()
    result = simulate(jobs, cluster(window.nodes, window.gpus_per_node, 8), named, **site_kwargs,
                      **loop_of(named.name), record=True)
    drawn = None
    if curves:
        from corral.sim.plot import Curves

        drawn = Curves.of(result)
    return window.key, policy, seed, result.metrics(), drawn, time.time() - started, time.process_time() - cpu


def mean_of(per_seed: dict[int, dict], key: str) -> float | None:
    values = [m[key] for m in per_seed.values() if m.get(key) is not None]
    return statistics.fmean(values) if values else None


def verdict(mine: dict[int, dict], base: dict[int, dict]) -> dict:
    """Each target: the ratio of the seeds' means, and on how many seeds the target holds."""
    seeds = sorted(set(mine) & set(base))
    out: dict = {"seeds": len(seeds)}
    for key, bound in TARGETS:
        a, b = mean_of({s: mine[s] for s in seeds}, key), mean_of({s: base[s] for s in seeds}, key)
        per_seed = [ratios(mine[s], base[s], (key,))[key] for s in seeds]
        out[key] = {"ratio": round(a / b, 4) if a is not None and b else None, "bound": bound,
                    "seeds_met": sum(r is not None and r <= bound for r in per_seed)}
    for key in ("utilization", "utilization_in_window"):
        a, b = mean_of({s: mine[s] for s in seeds}, key), mean_of({s: base[s] for s in seeds}, key)
        out[key] = {"difference": round(a - b, 4) if a is not None and b is not None else None,
                    "seeds_met": sum((mine[s].get(key) or 0) >= (base[s].get(key) or 0) for s in seeds)}
    over = mean_of({s: mine[s] for s in seeds}, "jct_over_floor")
    out["jct_over_floor"] = {"value": round(over, 4) if over is not None else None, "bound": FLOOR_SLACK,
                             "seeds_met": sum(mine[s]["jct_over_floor"] <= FLOOR_SLACK for s in seeds)}
    return out


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default=DEFAULT_WINDOWS)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the time-limit over-estimates (comma-separated)")
    parser.add_argument("--load", type=float, default=0.9, help="offered load each window's cluster is sized for")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--policies", default=",".join(BUILT_IN), help="built-in rows: any of fifo,slurm,corral")
    parser.add_argument("--no-baselines", action="store_true", help="only slurm and the variants")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=CONFIG",
                        help="a row for the site config CONFIG, labelled LABEL (repeatable)")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="write DIR/WINDOW.png per window (first seed)")
    parser.add_argument("--checkpointing", metavar="OVER,EVERY,COST",
                        help="assume jobs running over OVER checkpoint every EVERY and pay COST per restart "
                             "(durations, e.g. 1h,30m,5m); the traces declare none")
    parser.add_argument("--elastic", type=float, metavar="FRACTION",
                        help="mark this share of multi-GPU jobs elastic (min gpus/2, max 2 x gpus) and add the row "
                             f"{GROW_ROW} (growth into idle GPUs on; off in every other row)")
    parser.add_argument("--out", type=Path, help="the results file (a bare name: under bench/results/)")
    parser.add_argument("--reuse", type=Path, metavar="RESULTS.json",
                        help="take the built-in rows (slurm, corral, fifo) from this earlier results file where it "
                             "has them for the same window, cluster and seed, instead of replaying them")
    args = parser.parse_args()
    if not TRACES_DIR.is_dir():
        sys.exit(f"sim_windows: the traces are not here ({TRACES_DIR}); this benchmark replays the shared public "
                 "traces that sit beside the checkout (the tests use the small copies in tests/data/traces)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: expected whole numbers separated by commas")
    if not seeds:
        parser.error("--seeds: give at least one seed")
    if not 0 < args.load <= 1:
        parser.error(f"--load {args.load}: a share of the cluster in (0, 1]")
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: at least 1")
    policies = [p for p in args.policies.split(",") if p]
    if bad := [p for p in policies if p not in BUILT_IN]:
        parser.error(f"--policies: unknown {', '.join(bad)}; choose from {', '.join(BUILT_IN)}")
    if args.no_baselines:
        policies = [BASELINE]
    variants: dict[str, str] = {}
    for item in args.variant:
        label, sep, config = item.partition("=")
        if not sep or not label or not Path(config).is_file():
            parser.error(f"--variant {item!r}: expected LABEL=CONFIG with an existing config file")
        if label in BUILT_IN:
            parser.error(f"--variant {item!r}: the label {label!r} names a built-in row")
        try:
            load_site(Path(config))
        except SpecError as exc:
            parser.error(str(exc))
        variants[label] = str(Path(config).resolve())
    if args.plot is not None:
        from corral.sim.plot import PlotUnavailable, check_available

        try:
            check_available()
        except PlotUnavailable as exc:
            parser.error(f"--plot: {exc}")
        if args.plot.exists() and not args.plot.is_dir():
            parser.error(f"--plot {args.plot}: not a directory")
        args.plot.mkdir(parents=True, exist_ok=True)
    try:
        windows = [sized(parse_window(w.strip()), args.load) for w in args.windows.split(",") if w.strip()]
    except (ValueError, OSError) as exc:
        parser.error(f"--windows: {exc}")
    if args.elastic is not None and not 0 < args.elastic <= 1:
        parser.error(f"--elastic {args.elastic}: a share of the multi-GPU jobs in (0, 1]")
    rows = [*policies, *([GROW_ROW] if args.elastic else []), *variants]
    assumed = None
    if args.checkpointing:
        try:
            assumed = tuple(parse_duration(part.strip()) for part in args.checkpointing.split(","))
        except (ValueError, TypeError) as exc:
            parser.error(f"--checkpointing {args.checkpointing!r}: {exc}")
        if len(assumed) != 3 or not all(v > 0 for v in assumed):
            parser.error(f"--checkpointing {args.checkpointing!r}: expected three positive durations OVER,EVERY,COST")
    runs = [(w, p, s, variants.get(p), args.plot is not None and s == seeds[0], assumed, args.elastic) for w in windows
            for s in seeds for p in rows]
    # the big windows first, so the pool's last minutes are not one straggler
    runs.sort(key=lambda r: -r[0].jobs)
    results: dict[tuple[str, str], dict[int, dict]] = {}
    if args.reuse is not None:  # replays are deterministic: a built-in row of the same window and seed is the same
        earlier = json.loads(args.reuse.read_text())
        clusters = {w["key"]: (w["nodes"], w["gpus_per_node"]) for w in earlier["windows"]}
        kept = {(r["window"], r["policy"], r["seed"]): r for r in earlier["runs"]}
        todo = []
        for r in runs:
            w, p, s = r[0], r[1], r[2]
            hit = kept.get((w.key, p, s)) if p in BUILT_IN and not args.elastic and earlier.get("load") == args.load \
                and clusters.get(w.key) == (w.nodes, w.gpus_per_node) else None
            if hit is None:
                todo.append(r)
            else:
                results.setdefault((w.key, p), {})[s] = {k: v for k, v in hit.items() if k not in ("window", "policy",
                                                                                                 "seed")}
        print(f"sim_windows: {len(runs) - len(todo)} rows taken from {args.reuse}", file=sys.stderr)
        runs = todo
    print(f"sim_windows: {len(runs)} replays of {len(windows)} windows on {args.workers} workers", file=sys.stderr)
    started = time.time()
    drawn: dict[str, dict[str, object]] = {}
    cpu = 0.0
    with Pool(args.workers) as pool:
        for key, policy, seed, metrics, curves, took, used in pool.imap_unordered(run, runs):
            cpu += used
            results.setdefault((key, policy), {})[seed] = metrics
            if curves is not None:
                drawn.setdefault(key, {})[policy] = curves
            print(f"  {key} {policy} seed {seed}: mean wait {metrics['avg_wait_s']:,.0f} s, JCT "
                  f"{metrics['avg_jct_s']:,.0f} s (floor {metrics['jct_floor_s']:,.0f}), util "
                  f"{metrics['utilization']} ({took:.0f} s; {time.time() - started:.0f} s in all)",
                  file=sys.stderr, flush=True)
    elapsed = time.time() - started

    print(f"seeds {','.join(map(str, seeds))}; clusters sized for offered load ≤ {args.load}; {len(runs)} replays in "
          f"{elapsed / 60:.1f} min on {args.workers} workers ({cpu / 60:.1f} CPU-min)\n")
    print("| window | jobs | users | cluster | offered load | in-window load |")
    print("| --- | --- | --- | --- | --- | --- |")
    for w in windows:
        print(f"| {w.key} [{w.after:.5g}, {w.before:.5g}) s | {w.jobs:,} | {w.users} | {w.nodes} × {w.gpus_per_node} "
              f"| {w.offered_load:.2f} | {w.in_window_load:.2f} |")
    print()
    print("| window | policy | mean wait (s) | p50 wait | p99 wait | bounded slowdown (p99) | mean JCT (s) | JCT floor "
          "| JCT / floor | utilisation (in window) | worst user mean wait (s) | preemptions (GPU-h lost) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in windows:
        label = w.key
        for policy in rows:
            per_seed = results.get((w.key, policy))
            if not per_seed:
                continue
            m = {k: mean_of(per_seed, k) for k in SHOWN}
            in_window = f"{m['utilization_in_window']:.3f}" if m["utilization_in_window"] is not None else "-"
            print(f"| {label} | {policy} | {fmt_s(m['avg_wait_s'])} | {fmt_s(m['p50_wait_s'])} | "
                  f"{fmt_s(m['p99_wait_s'])} | {m['bounded_slowdown']:.2f} ({m['p99_bounded_slowdown']:.1f}) | "
                  f"{fmt_s(m['avg_jct_s'])} | {fmt_s(m['jct_floor_s'])} | {m['jct_over_floor']:.3f} | "
                  f"{m['utilization']:.3f} ({in_window}) | {fmt_s(m['max_user_wait_s'])} | "
                  f"{m['preemptions']:.0f} ({m['lost_gpu_s'] / 3600:,.0f}) |")
            label = ""

    if args.elastic:
        print(f"\nelastic jobs ({args.elastic:g} of the multi-GPU ones): shrinks and GPUs grown into, seeds' means\n")
        print("| window | policy | shrinks | GPUs grown |")
        print("| --- | --- | --- | --- |")
        for w in windows:
            for policy in rows:
                per_seed = results.get((w.key, policy))
                if per_seed:
                    print(f"| {w.key} | {policy} | {mean_of(per_seed, 'shrinks') or 0:.0f} | "
                          f"{mean_of(per_seed, 'grown') or 0:.0f} |")

    verdicts: dict[str, dict] = {}
    for w in windows:
        base = results.get((w.key, BASELINE), {})
        for policy in rows:
            mine = results.get((w.key, policy), {})
            if policy not in (BASELINE, "fifo") and base and mine:  # the targets are corral's (and its variants')
                verdicts[f"{w.key} {policy}"] = verdict(mine, base)
    if verdicts:
        n = len(seeds)
        print(f"\nagainst {BASELINE} (ratio of the {n} seeds' means; in brackets, seeds where the target holds):\n")
        print("| window | policy | mean wait ÷ slurm (≤ 0.5) | p99 wait ÷ slurm (≤ 0.5) | bounded slowdown ÷ slurm "
              "(≤ 0.3) | worst user wait ÷ slurm (≤ 0.75) | utilisation − slurm (≥ 0) | in window − slurm (≥ 0) "
              "| JCT / floor (≤ 1.02) | targets met |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, v in verdicts.items():
            key, policy = name.rsplit(" ", 1)
            cells, met = [], 0
            for metric, bound in TARGETS:
                r = v[metric]["ratio"]
                ok = r is not None and r <= bound
                met += ok
                cells.append(f"{'-' if r is None else f'{r:.2f}'}{' ✓' if ok else ''} ({v[metric]['seeds_met']}/{n})")
            for metric in ("utilization", "utilization_in_window"):
                d = v[metric]["difference"]
                ok = d is not None and d >= 0
                met += metric == "utilization" and ok
                cells.append(f"{'-' if d is None else f'{d:+.4f}'}{' ✓' if ok else ''} ({v[metric]['seeds_met']}/{n})")
            over = v["jct_over_floor"]["value"]
            ok = over is not None and over <= FLOOR_SLACK
            met += ok
            cells.append(f"{over:.3f}{' ✓' if ok else ''} ({v['jct_over_floor']['seeds_met']}/{n})")
            print(f"| {key} | {policy} | {' | '.join(cells)} | {met}/{len(TARGETS) + 2} |")

    if args.plot is not None:
        from corral.sim.plot import draw

        for w in windows:
            curves = {p: drawn[w.key][p] for p in rows if p in drawn.get(w.key, {})}
            if curves:
                path = args.plot / f"{w.key.replace(':', '-')}.png"
                draw(curves, path, f"{w.label()}, time-limit seed {seeds[0]}")
                print(f"plot: {path}", file=sys.stderr)
    record = {"at": datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:], "seeds": seeds,
              "load": args.load, "checkpointing": args.checkpointing, "elastic": args.elastic, "elapsed_s": round(elapsed, 1), "cpu_s": round(cpu, 1), "variants": variants,
              "windows": [asdict(w) for w in windows], "verdicts": verdicts,
              # in the order asked for (windows, then policies, then seeds), not the order the replays
              # ended in: two runs of one study (or one reusing another's rows) list them alike
              "runs": [{"window": w.key, "policy": p, "seed": s, **results[(w.key, p)][s]} for w in windows
                       for p in rows for s in seeds if s in results.get((w.key, p), {})]}
    path = args.out or Path("sim_windows_variants.json" if variants else "sim_windows.json")
    if path.parent == Path("."):
        path = ROOT / "bench" / "results" / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"results: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
