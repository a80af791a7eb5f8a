"""Executors: where replicas run. ``local`` (processes on this machine, the embedded
default), ``ray`` (a Ray cluster) and ``slurm`` (job steps in Slurm allocations), the last
two imported only when a site uses them. The
contract is in ``base``; ``build`` makes the executors a site asks for."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing base pulls in the spec models: too slow for every Ray actor's worker
    from corral.executors.contract import Executor
    from corral.settings import Settings


def scope_of(settings: Settings) -> str:
    """One name per CORRAL_HOME, so two servers' cgroups, Ray actors and files never mix."""
    return hashlib.sha1(str(settings.home).encode()).hexdigest()[:10]


def build(settings: Settings, site, wake: Callable[[], None]) -> dict[str, Executor]:
    import os

    from corral.executors.local.executor import LocalExecutor

    executors: dict[str, Executor] = {
        "local": LocalExecutor(site.nodes, settings.runs_dir, settings.logs_dir, settings.runtime_dir,
                               scope_of(settings), wake, os.environ.get("PYTHONPATH"))}
    if getattr(site, "ray", None) is not None:
        from corral.executors.ray.executor import RayExecutor  # Ray is an optional extra: imported only here

        executors["ray"] = RayExecutor(site.ray, settings, scope_of(settings), wake)
    if getattr(site, "slurm", None) is not None:
        from corral.executors.slurm.executor import SrunExecutor
        from corral.site import inside_allocation

        executors["slurm"] = SrunExecutor(settings, scope_of(settings), wake, inside_allocation(site.slurm))
    return executors
