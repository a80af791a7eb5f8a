#!/usr/bin/env python3
"""The README's simulator table: every shared trace through ``fifo``, ``slurm`` (the
baseline, Slurm's main scheduler on every event and backfill every 30 s) and ``corral``
(a full cycle on every event, as its control loop runs), on clusters sized for 70-95 %
offered load, each over several seeds of the users' time-limit over-estimates.

  python bench/sim_table.py [--traces tiresias,4vc,0e4a51,alibaba,pollux] [--seeds 0,1,2,3,4,5,6,7]
                            [--pollux-seeds 0] [--workers 2] [--with-expansion]
                            [--variant LABEL=config.yaml ...] [--no-baselines]

Prints one markdown row per trace and policy (means over the seeds) and, per trace, how
many seeds corral met each target against slurm: lower mean JCT, utilisation at least
slurm's, worst per-user mean wait no worse. ``util bound`` is the highest utilisation any
schedule can reach on that trace (its last job run the moment it arrives): when slurm is
already there, corral can only tie. The small traces get eight seeds: one long job decides
utilisation, so three seeds flipped its mean. philly-pollux (82k jobs) replays in 10-25 min
per policy on one core (corral+x: ~40), so it gets one seed by default (``--pollux-seeds
0,1,2`` for more) and no fifo (at that load FIFO's queue only grows).
``--with-expansion`` adds ``corral+x``: corral with the expansion factor (Maui's XFACTOR)
weighted 10000, the variant its default leaves out. ``--variant`` adds a row per
site config (its scheduler section and account tree, as ``corral sim --config`` reads them),
judged against slurm like corral; the README's variant tables come from the configs in
bench/variants/. ``--no-baselines`` runs only slurm and the variants (slurm is what they are
judged against). Results are also written to bench/results/sim_table.json (or, with
variants, sim_variants.json)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corral.scheduler import Policy  # noqa: E402
from corral.sim.engine import cluster, loop_of, simulate  # noqa: E402
from corral.sim.trace import load_trace  # noqa: E402
from corral.site import load_site  # noqa: E402
from corral.spec import SpecError  # noqa: E402

TRACES_DIR = ROOT.parent / "shared" / "traces"
# key: (file, nodes, GPUs per node, --after, description)
TRACES = {
    "tiresias": ("tiresias-60.csv", 2, 8, None, "tiresias-60 (60 jobs; 2 × 8 GPUs)"),
    "4vc": ("philly-gavel-4vc.csv", 11, 8, None, "philly-gavel-4vc (2,554 jobs, 4 users; 11 × 8)"),
    "0e4a51": ("philly-gavel-0e4a51.csv", 10, 8, None, "philly-gavel-0e4a51 (1,181 jobs, 1 user; 10 × 8)"),
    "alibaba": ("alibaba-pai-v2023.csv", 7, 4, 9.9e6,
                "alibaba-pai-v2023 without its 24 resident pods (6,179 jobs; 7 × 4, `--after 9.9e6`)"),
    "pollux": ("philly-pollux.csv", 56, 8, None, "philly-pollux (82,247 jobs, 15 users; 56 × 8)"),
}
KEYS = ("avg_jct_s", "p50_jct_s", "utilization", "utilization_bound", "max_user_wait_s", "bounded_slowdown",
        "sched_cpu_s")


def run(args: tuple[str, str, int, str | None]) -> tuple[str, str, int, dict]:
    key, policy, seed, config = args
    file, nodes, gpus, after, _ = TRACES[key]
    jobs = load_trace(TRACES_DIR / file, None, seed, after)
    base, site_kwargs = policy.removesuffix("+x"), {}
    if config is not None:  # a variant: the site's policy, as `corral sim --config` runs it
        named, site_kwargs = load_site(Path(config)).replay(("leaf",))
        base = named.name
    else:
        named = Policy.named(base, topology=("leaf",))
        if policy.endswith("+x"):
            named = Policy.named(base, topology=("leaf",), weights=replace(named.weights, expansion=10000.0))
    result = simulate(jobs, cluster(nodes, gpus, 8), named, **site_kwargs, **loop_of(base))
    return key, policy, seed, result.metrics()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    parser.add_argument("--pollux-seeds", default="0")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--with-expansion", action="store_true")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=CONFIG",
                        help="a row for the site config CONFIG, labelled LABEL (repeatable)")
    parser.add_argument("--no-baselines", action="store_true", help="only slurm and the variants")
    args = parser.parse_args()
    if not TRACES_DIR.is_dir():
        sys.exit(f"sim_table: the traces are not here ({TRACES_DIR}); this benchmark replays the shared public "
                 "traces that sit beside the checkout (the tests use the small copies in tests/data/traces)")
    variants: dict[str, str] = {}
    for item in args.variant:
        label, sep, config = item.partition("=")
        if not sep or not label or not Path(config).is_file():
            parser.error(f"--variant {item!r}: expected LABEL=CONFIG with an existing config file")
        if label in ("fifo", "slurm", "corral", "corral+x"):
            parser.error(f"--variant {item!r}: the label {label!r} names a built-in row")
        try:
            load_site(Path(config))
        except SpecError as exc:
            parser.error(str(exc))
        variants[label] = config
    keys = [k for k in args.traces.split(",") if k]
    unknown = [k for k in keys if k not in TRACES]
    if unknown:
        parser.error(f"unknown trace(s) {', '.join(unknown)}; choose from {', '.join(TRACES)}")
    runs = []
    for key in keys:
        seeds = [int(s) for s in (args.pollux_seeds if key == "pollux" else args.seeds).split(",")]
        policies = ("slurm", "corral") if key == "pollux" else ("fifo", "slurm", "corral")
        policies += ("corral+x",) if args.with_expansion else ()
        if args.no_baselines:
            policies = ("slurm",)
        policies += tuple(variants)
        # the long ones first, so the pool's last minutes are not one straggler
        runs += [(key, p, s, variants.get(p)) for s in seeds for p in policies]
    runs.sort(key=lambda r: r[0] != "pollux")
    started = time.time()
    results: dict[tuple[str, str], dict[int, dict]] = {}
    with Pool(args.workers) as pool:
        for key, policy, seed, metrics in pool.imap_unordered(run, runs):
            results.setdefault((key, policy), {})[seed] = metrics
            print(f"  {key} {policy} seed {seed}: JCT {metrics['avg_jct_s']:,.0f} s, "
                  f"util {metrics['utilization']}, worst user wait {metrics['max_user_wait_s']:,.0f} s "
                  f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    print("| trace (cluster) | policy | avg JCT (s) | p50 JCT (s) | utilisation (bound) | worst user mean wait (s) "
          "| bounded slowdown | scheduler CPU (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    verdicts = {}
    for key in keys:
        label = TRACES[key][4]
        for policy in ("fifo", "slurm", "corral", "corral+x", *variants):
            per_seed = results.get((key, policy))
            if not per_seed:
                continue
            mean = {k: statistics.fmean(m[k] for m in per_seed.values()) for k in KEYS}
            print(f"| {label} | {policy} | {mean['avg_jct_s']:,.0f} | {mean['p50_jct_s']:,.0f} | "
                  f"{mean['utilization']:.4f} ({mean['utilization_bound']:.4f}) | {mean['max_user_wait_s']:,.0f} | "
                  f"{mean['bounded_slowdown']:.1f} | {mean['sched_cpu_s']:.1f} |")
            label = ""
        slurm = results.get((key, "slurm"), {})
        for judged in ("corral", *variants):
            mine = results.get((key, judged), {})
            seeds = sorted(set(slurm) & set(mine))
            if seeds:
                verdicts[f"{key} {judged}"] = {
                    "seeds": len(seeds),
                    "lower_jct": sum(mine[s]["avg_jct_s"] < slurm[s]["avg_jct_s"] for s in seeds),
                    "util_at_least": sum(mine[s]["utilization"] >= slurm[s]["utilization"] for s in seeds),
                    "util_higher": sum(mine[s]["utilization"] > slurm[s]["utilization"] for s in seeds),
                    "worst_wait_no_worse": sum(mine[s]["max_user_wait_s"] <= slurm[s]["max_user_wait_s"]
                                               for s in seeds),
                }
    print()
    print("against slurm, seeds where the target holds:")
    for key, v in verdicts.items():
        print(f"  {key}: lower mean JCT {v['lower_jct']}/{v['seeds']}, utilisation >= {v['util_at_least']}/{v['seeds']}"
              f" (> {v['util_higher']}), worst user wait no worse {v['worst_wait_no_worse']}/{v['seeds']}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    record = {"at": datetime.now().isoformat(timespec="seconds"), "verdicts": verdicts, "variants": variants,
              "runs": [{"trace": k, "policy": p, "seed": s, **m}
                       for (k, p), by in results.items() for s, m in by.items()]}
    name = "sim_variants.json" if variants else "sim_table.json"
    (out / name).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
