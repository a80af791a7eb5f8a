"""``corral sim``: replay a trace through the scheduler (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from corral.scheduler import NodeView, Policy
from corral.sim.engine import cluster, loop_of, simulate
from corral.sim.trace import TraceError, load_nodes_csv, load_trace
from corral.site import load_site
from corral.spec.loader import SpecError


@click.command("sim")
@click.option("--trace", "trace", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CSV: job_id,user,submit_s,gpus,duration_s,gpu_type")
@click.option("--policy", type=click.Choice(["fifo", "slurm", "corral"]), default="corral", show_default=True)
@click.option("--nodes", type=int, default=16, show_default=True)
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--nodes-per-leaf", type=int, default=8, show_default=True)
@click.option("--nodes-csv", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A real node list (the Alibaba trace's nodes CSV) instead of --nodes/--gpus-per-node.")
@click.option("--limit", type=int, help="Replay only the first N jobs.")
@click.option("--after", type=float, help="Only jobs submitted at or after this second of the trace.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the time-limit over-estimates.")
@click.option("--bf-interval", type=float, default=30.0, show_default=True,
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
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sim(ctx: click.Context, trace: Path, policy: str, nodes: int, gpus_per_node: int, nodes_per_leaf: int,
        nodes_csv: Path | None, limit: int | None, after: float | None, seed: int, bf_interval: float,
        config: Path | None, grace: float, as_json: bool) -> None:
    """Replay TRACE through the scheduler and print JCT, waits, utilisation, fairness and
    what preemption cost (jobs preempted, requeued, cancelled, shrunk; GPU-seconds lost).

    Preemption needs a --config with partitions or QOS that may preempt, and a trace whose
    optional partition/qos columns name them (see corral.sim.trace for the columns)."""
    # with leaf switches declared, multi-node gangs are placed under the fewest of them
    levels = ("leaf",) if nodes_per_leaf and not nodes_csv else ()
    named, site_kwargs = Policy.named(policy, topology=levels), {}
    try:
        jobs = load_trace(trace, limit, seed, after)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    if config is not None:
        if ctx.get_parameter_source("policy") is not ParameterSource.DEFAULT:
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
        policy = named.name
    elif any(j.partition or j.qos for j in jobs):
        click.echo("note: the trace's jobs name partitions or QOS; without a --config that declares them, every "
                   "job is in one partition and nothing is preempted", err=True)
    if nodes_csv:
        views = [NodeView(name, gpus, 1e6, 1e9, model) for name, gpus, model in load_nodes_csv(nodes_csv) if gpus > 0]
        # one GPU pool: the trace's jobs name no GPU model
        views = [NodeView(v.name, v.gpus, v.cpus, v.memory, None) for v in views]
    else:
        views = cluster(nodes, gpus_per_node, nodes_per_leaf)
    result = simulate(jobs, views, named, **site_kwargs, **loop_of(policy, bf_interval), grace_s=grace)
    metrics = {"trace": trace.name, "policy": policy, "gpus": result.total_gpus, **result.metrics()}
    if as_json:
        click.echo(json.dumps(metrics))
        return
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        click.echo(f"{key.ljust(width)}  {value}")
