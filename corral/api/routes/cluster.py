"""Cluster routes: the node pool with what is free, fair share, priorities (any role may read
them), and the server's health (``public``: answered without a token, for probes and the
CLI's check that a server is up)."""

from __future__ import annotations

import os

from fastapi import APIRouter, Response

from corral import __version__
from corral.api.deps import StateDep
from corral.api.errors import documented
from corral.api.schemas import Health, NodeOut, PartitionOut, PriorityOut, ShareOut

router = APIRouter(prefix="/v1", tags=["cluster"], responses=documented(401, 403))
public = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/nodes", response_model=list[NodeOut])
def nodes(state: StateDep):
    view = state.loop.view
    free = {n.name: n for n in state.read(state.loop.reads.free_nodes)}
    up = [NodeOut(name=n.name, gpus=n.gpus, gpu_type=n.gpu_type, cpus=n.cpus, memory=n.memory, labels=n.labels,
                  free_gpus=sorted(free[n.name].free_gpus), free_cpus=round(free[n.name].free_cpus, 3),
                  free_memory=round(free[n.name].free_memory, 3), infra=view.node_infra.get(n.name, "local"))
          for n in view.nodes if n.name in free]
    down = [NodeOut(name=n.name, gpus=n.gpus, gpu_type=n.gpu_type, cpus=n.cpus, memory=n.memory, labels=n.labels,
                    free_gpus=[], free_cpus=0.0, free_memory=0.0, state="DOWN", infra=infra)
            for n, infra in view.down]
    return up + down


@router.get("/partitions", response_model=list[PartitionOut])
def partitions(state: StateDep):
    """The site's partitions (config.yaml), the default first; DOWN with why while the engine
    of its infra does not answer."""
    site = state.site
    default = site.policy.default_partition.name
    infra = site.partition_infra
    down = state.loop.view.down_partitions
    return [PartitionOut(name=p.name, infra=infra.get(p.name), slurm_partition=site.provisioned.get(p.name, ("", ""))[1] or None,
                         nodes=list(p.nodes), max_time=p.max_time, default_time=p.default_time, default=p.name == default,
                         state="DOWN" if p.name in down else "UP", reason=down.get(p.name))
            for p in site.policy.partitions]


@public.get("/health", response_model=Health, responses={503: {"model": Health, "description": "the control loop keeps failing"}})
def health(state: StateDep, response: Response):
    dialect = state.settings.db_url.split(":", 1)[0].split("+", 1)[0]
    view = state.loop.view
    failing = view.failing_cycles >= 3  # one bad cycle is retried; several in a row are an outage
    if failing:
        response.status_code = 503
    return Health(status="failing" if failing else "ok", version=__version__, database=dialect, pid=os.getpid(),
                  nodes=len(view.nodes), cycles=view.cycles, loop_error=view.last_error if failing else None,
                  unreachable=dict(view.unreachable))


@router.get("/share", response_model=list[ShareOut])
def share(state: StateDep):
    """Every account and user of the fair-share tree with shares, decayed usage and factor."""
    return [ShareOut(**vars(r)) for r in state.read(state.loop.reads.share)]


@router.get("/priority", response_model=list[PriorityOut])
def priority(state: StateDep):
    """Pending jobs in scheduling order with the weighted factors of their priority."""
    w = state.site.policy.weights
    now = state.clock()
    out = []
    for job in state.read(lambda: state.loop.reads.ranked(now)):
        f, reason, starving = job.factors, job.reason, job.starving
        out.append(PriorityOut(
            id=job.id, name=job.name, user=job.user, account=job.account, partition=job.partition, qos=job.qos,
            priority=round(f.total, 3) if f else 0.0, age=round(w.age * f.age, 3) if f else 0.0,
            fair_share=round(w.fair_share * f.fair_share, 3) if f else 0.0,
            job_size=round(w.job_size * f.job_size, 3) if f else 0.0,
            partition_factor=round(w.partition * f.partition, 3) if f else 0.0,
            qos_factor=round(w.qos * f.qos, 3) if f else 0.0,
            expansion=round(w.expansion * f.expansion, 3) if f else 0.0, nice=job.nice,
            starving=starving, reason=reason))
    return out
