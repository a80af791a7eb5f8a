"""``corral sim``: replay a trace through the scheduler (no server needed), under one policy or
several side by side (each column against the ``slurm`` model when it is among them), over
the whole trace or a window of it (``--after`` / ``--before``), and optionally drawn
(``--plot``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
from click.core import ParameterSource

from corral.scheduler import NodeView, Policy
from corral.sim.engine import cluster, loop_of, simulate
from corral.sim.results import COMPARED, ratios
from corral.sim.trace import TraceError, load_nodes_csv, load_trace
from corral.sim.window import cut, in_window_load, offered_load
from corral.site import load_site
from corral.spec.loader import SpecError

POLICIES = ("fifo", "slurm", "corral")
BASELINE = "slurm"
SHOWN_USERS = 20  # the text output lists this many users' mean waits (--json has them all)


def _policies(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    """``--policy slurm,corral`` and ``--policy slurm --policy corral`` alike; each once."""
    out: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if name not in POLICIES:
                raise click.BadParameter(f"{name!r} is not one of {', '.join(POLICIES)}", ctx, param)
            if name not in out:
                out.append(name)
    return out


def _seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"a finite number of seconds, got {value!r}", ctx, param)
    return value


def _plot_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Refused before the replay, not after it: a directory that is not there, or a format
    matplotlib cannot write."""
    if value is None:
        return None
    if not value.parent.is_dir():
        raise click.BadParameter(f"{str(value)!r}: the directory {str(value.parent)!r} does not exist", ctx, param)
    from corral.sim.plot import PlotUnavailable, check_available

    try:
        check_available()
    except PlotUnavailable as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if value.suffix.lstrip(".").lower() not in formats:
        raise click.BadParameter(f"{str(value)!r}: name a file ending in one of "
                                 f"{', '.join('.' + f for f in sorted(formats))} (.png for a picture)", ctx, param)
    return value


@click.command("sim")
@click.option("--trace", "trace", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CSV: job_id,user,submit_s,gpus,duration_s,gpu_type")
@click.option("--policy", "policies", multiple=True, default=("corral",), show_default=True, callback=_policies,
              metavar="fifo|slurm|corral[,...]",
              help="The policy to replay; several (comma-separated or repeated) replay side by side, with their "
                   "ratios to slurm when slurm is among them.")
@click.option("--nodes", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--nodes-per-leaf", type=click.IntRange(min=0), default=8, show_default=True)
@click.option("--nodes-csv", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A real node list (the Alibaba trace's nodes CSV) instead of --nodes/--gpus-per-node.")
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the first N jobs (of the window).")
@click.option("--after", type=float, callback=_seconds, help="Only jobs submitted at or after this second of the trace.")
@click.option("--before", type=float, callback=_seconds,
              help="Only jobs submitted before this second of the trace: --after A --before B replays the window "
                   "[A, B).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the time-limit over-estimates.")
@click.option("--bf-interval", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="slurm only: seconds between its backfill passes (bf_interval); its main scheduler runs on "
                   "every event. fifo and corral run a full cycle on every event, as corral's control loop does.")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A site's config.yaml: its scheduler section (policy, weights, max_age, age_power, size_by, "
                   "starve_after, half_life, backfill, packing …) and account tree replace --policy's defaults, "
                   "so a site can try a knob on a trace before it sets it. The cluster still comes from the "
                   "options above.")
@click.option("--grace", type=click.FloatRange(min=0, max=1e9), default=30.0, show_default=True,
              help="Seconds a preempted job (or a shrunk task's stopped replicas) holds its resources after the "
                   "stop signal, before it is requeued or cancelled.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False, path_type=Path), callback=_plot_path,
              help="Draw the wait CDF, the bounded-slowdown CDF, GPUs in use over time and each user's mean wait, "
                   "one curve per policy, to this file (.png; needs the 'plot' extra: matplotlib).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sim(ctx: click.Context, trace: Path, policies: list[str], nodes: int, gpus_per_node: int, nodes_per_leaf: int,
        nodes_csv: Path | None, limit: int | None, after: float | None, before: float | None, seed: int,
        bf_interval: float, config: Path | None, grace: float, plot: Path | None, as_json: bool) -> None:
    """Replay TRACE through the scheduler and print JCT beside its zero-wait floor (the mean
    run time), waits (mean, p50, p99), bounded slowdown, utilisation, each user's mean wait
    and what preemption cost (jobs preempted, requeued, cancelled, shrunk; GPU-seconds lost).

    Preemption needs a --config with partitions or QOS that may preempt, and a trace whose
    optional partition/qos columns name them (see corral.sim.trace for the columns)."""
    if after is not None and before is not None and before <= after:
        raise click.BadParameter(f"{before:g} is not later than --after {after:g}: the window [after, before) "
                                 "would be empty", ctx, _param(ctx, "before"))
    # with leaf switches declared, multi-node gangs are placed under the fewest of them
    levels = ("leaf",) if nodes_per_leaf and not nodes_csv else ()
    try:
        # --before is cut after loading: a job's drawn time limit is then the same in every window
        jobs = cut(load_trace(trace, limit, seed, after), before)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    if not jobs and (after is not None or before is not None):
        raise click.ClickException(f"no job of {trace.name} was submitted in [{_bound(after)}, {_bound(before)})")
    runs = [(p, Policy.named(p, topology=levels), {}) for p in policies]
    if config is not None:
        if ctx.get_parameter_source("policies") is not ParameterSource.DEFAULT:
            raise click.UsageError("give the policy either with --policy or in the config's scheduler.policy, "
                                   "not both")
        try:
            site = load_site(config)
        except SpecError as exc:
            raise click.ClickException(str(exc)) from None
        tiers = any(j.partition or j.qos for j in jobs)
        if (site.policy.partitions or site.policy.qos) and not tiers:
            click.echo("note: the trace's jobs name no partition or QOS; the config's partitions and qos are "
                       "not used", err=True)
        named, site_kwargs = site.replay(levels, tiers)
        runs = [(named.name, named, site_kwargs)]
    elif any(j.partition or j.qos for j in jobs):
        click.echo("note: the trace's jobs name partitions or QOS; without a --config that declares them, every "
                   "job is in one partition and nothing is preempted", err=True)
    if nodes_csv:
        views = [NodeView(name, gpus, 1e6, 1e9, model) for name, gpus, model in load_nodes_csv(nodes_csv) if gpus > 0]
        # one GPU pool: the trace's jobs name no GPU model
        views = [NodeView(v.name, v.gpus, v.cpus, v.memory, None) for v in views]
    else:
        views = cluster(nodes, gpus_per_node, nodes_per_leaf)
    total = sum(v.gpus for v in views)
    head = {"trace": trace.name, "gpus": total, "offered_load": round(offered_load(jobs, total, after, before), 4),
            "in_window_load": round(in_window_load(jobs, total, after, before), 4)}
    results, table = {}, {}
    for label, named, site_kwargs in runs:
        # record every hold: utilisation while jobs arrive, and the plot's GPUs in use, read them
        results[label] = simulate(jobs, views, named, **site_kwargs, **loop_of(named.name, bf_interval),
                                  grace_s=grace, record=True)
        table[label] = {"trace": trace.name, "policy": label, **{k: v for k, v in head.items() if k != "trace"},
                        **results[label].metrics()}
    if plot is not None:
        from corral.sim.plot import Curves, draw

        window = f", submitted in [{_bound(after)}, {_bound(before)}) s" if after is not None or before is not None else ""
        draw({label: Curves.of(r) for label, r in results.items()}, plot,
             f"{trace.name}{window}: {len(jobs):,} jobs on {total} GPUs (offered load {head['offered_load']:.2f}), "
             f"time-limit seed {seed}")
    against = {label: ratios(m, table[BASELINE]) for label, m in table.items()
               if BASELINE in table and label != BASELINE}
    if as_json:
        if len(table) == 1:
            click.echo(json.dumps(next(iter(table.values()))))
        else:
            click.echo(json.dumps({**head, "runs": list(table.values()), f"vs_{BASELINE}": against}))
    elif len(table) == 1:
        _print_one(next(iter(table.values())))
    else:
        _print_side_by_side(head, table, against)
    if plot is not None and not as_json:
        click.echo(f"\nplot: {plot}")


def _param(ctx: click.Context, name: str) -> click.Parameter | None:
    return next((p for p in ctx.command.params if p.name == name), None)


def _bound(value: float | None) -> str:
    return "…" if value is None else f"{value:g}"


def _print_one(metrics: dict) -> None:
    shown = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        click.echo(f"{key.ljust(width)}  {value}")
    _print_users({metrics["policy"]: metrics})


def _print_side_by_side(head: dict, table: dict[str, dict], against: dict[str, dict]) -> None:
    """One column per policy, then one per policy's ratio to the baseline on the compared
    metrics (below 1: fewer seconds than slurm; for utilisation, above 1 is better)."""
    keys = [k for k in next(iter(table.values())) if k not in head and k != "policy"
            and not isinstance(next(iter(table.values()))[k], dict)]
    width = max(len(k) for k in [*keys, *head])
    for key, value in head.items():
        click.echo(f"{key.ljust(width)}  {value}")
    columns = [*table, *(f"{label}/{BASELINE}" for label in against)]
    cells = {key: [_cell(m.get(key)) for m in table.values()]
             + [_cell(r.get(key), ratio=True) if key in COMPARED else "" for r in against.values()] for key in keys}
    widths = [max(len(c), *(len(row[i]) for row in cells.values())) for i, c in enumerate(columns)]
    click.echo(" " * width + "  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for key in keys:
        click.echo(key.ljust(width) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells[key], widths)))
    _print_users(table)


def _cell(value, ratio: bool = False) -> str:
    if value is None:
        return "-"
    if ratio:
        return f"{value:.3f}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return str(value)


def _print_users(table: dict[str, dict]) -> None:
    """Each user's mean wait (s), the worst first, one column per policy."""
    waits = {label: m.get("user_mean_wait_s", {}) for label, m in table.items()}
    worst: dict[str, float] = {}
    for by_user in waits.values():
        for user, wait in by_user.items():
            worst[user] = max(worst.get(user, 0.0), wait)
    if not worst:
        return
    users = sorted(worst, key=lambda u: (-worst[u], u))
    more = f" ({SHOWN_USERS} of {len(users)} shown; --json lists all)" if len(users) > SHOWN_USERS else ""
    click.echo(f"\nmean wait per user (s), the worst first{more}:")
    width = max(len(u) for u in users[:SHOWN_USERS])
    labels = list(waits)
    widths = [max(len(label), 12) for label in labels]
    click.echo(" " * width + "  " + "  ".join(label.rjust(w) for label, w in zip(labels, widths)))
    for user in users[:SHOWN_USERS]:
        row = [_cell(waits[label].get(user)) for label in labels]
        click.echo(user.ljust(width) + "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
