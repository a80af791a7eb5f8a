"""The ``slurm`` infra: replicas are job steps in Slurm allocations, through Slurm's own
commands on PATH (``SLURM_CONF`` from the environment). A partition with ``infra: slurm``
provisions one Slurm job per corral job (its nodes are named ``s<slurm id>-<host>``); a
server started inside an allocation (``salloc``, ``sbatch``) uses that allocation's nodes
as its pool. Kept apart from the executor so the site can read the section cheaply."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from corral.executors.registry import Infra
from corral.spec.base import Strict


class SlurmConfig(Strict):
    """``inside: auto``: a server started inside an allocation uses its nodes as the pool.
    ``forward``: which of a job's corral account and QOS are passed to Slurm (when the site's
    names are Slurm's own)."""

    inside: Literal["auto", "off"] = "auto"
    forward: list[Literal["account", "qos"]] = []
    # the largest file_mounts source (file or directory) staged for nodes that do not see it
    # (on neither corral's home's device nor a shared filesystem: corral.node.staging.stage)
    file_mounts_max_gb: float = Field(default=1.0, gt=0)


def inside_allocation(config: SlurmConfig | None) -> str | None:
    """The Slurm job this server runs inside whose nodes it should use, if any."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("CORRAL_SLURM_INSIDE", "auto") == "off" or (config is not None and config.inside == "off"):
        return None
    return job


def _build(settings, config: SlurmConfig, nodes, wake):  # noqa: ANN001 - see Infra.build
    from corral.executors import scope_of
    from corral.executors.slurm.executor import SrunExecutor

    return SrunExecutor(settings, scope_of(settings), wake, inside_allocation(config), forward=tuple(config.forward),
                        file_mounts_max_gb=config.file_mounts_max_gb)


def _implied() -> SlurmConfig | None:
    return SlurmConfig() if inside_allocation(None) else None


def _replaces_pool(config: SlurmConfig) -> bool:
    # this machine is one of the allocation's nodes: the pool is the allocation
    return inside_allocation(config) is not None


def _partition_nodes(config: SlurmConfig, patterns: tuple[str, ...], declared: list[str]) -> tuple[str, ...]:
    return ("s[0-9]*",)  # the nodes of its jobs' allocations, named s{slurm job}-{host}


def _mounts_check(config: SlurmConfig, records: Path, mounts: list[tuple[str, str]]) -> dict[str, str]:
    from corral.node.staging import oversized

    return oversized(records, mounts, int(config.file_mounts_max_gb * 2**30))  # as the executor counts it


INFRA = Infra(name="slurm", config=SlurmConfig, build=_build, partition_nodes=_partition_nodes,
              runtime_nodes=lambda config: inside_allocation(config) is not None,
              provisions=True, implied=_implied, replaces_pool=_replaces_pool,
              mounts_check=_mounts_check)
