"""Cluster routes: the node pool with what is free, and the server's health."""

from __future__ import annotations

import os

from fastapi import APIRouter

from corral import __version__
from corral.api.deps import StateDep
from corral.api.schemas import Health, NodeOut

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/nodes", response_model=list[NodeOut])
def nodes(state: StateDep):
    free = {n.name: n for n in state.controller.snapshot().nodes}
    return [NodeOut(name=n.name, gpus=n.gpus, gpu_type=n.gpu_type, cpus=n.cpus, memory=n.memory, labels=n.labels,
                    free_gpus=sorted(free[n.name].free_gpus), free_cpus=round(free[n.name].free_cpus, 3),
                    free_memory=round(free[n.name].free_memory, 3)) for n in state.nodes]


@router.get("/health", response_model=Health)
def health(state: StateDep):
    dialect = state.settings.db_url.split(":", 1)[0].split("+", 1)[0]
    return Health(status="ok", version=__version__, database=dialect, pid=os.getpid(), nodes=len(state.nodes),
                  cycles=state.controller.cycles)
