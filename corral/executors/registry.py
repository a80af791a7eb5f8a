"""Which infras exist, and how each is configured and built.

An infra is a plugin: a folder under ``corral/executors/`` (or a distribution of its own)
whose ``plugin`` module defines an ``Infra``: its name (what ``infra:`` says in
``config.yaml``), the schema of its section under ``infra:``, how a partition of it finds
its nodes, and how its executor is built. corral's own are listed below; other packages add
theirs through the ``corral.infras`` entry-point group::

    [project.entry-points."corral.infras"]
    kubernetes = "corral_kubernetes.plugin:INFRA"

Nothing outside ``executors/`` and the site's configuration looks at an infra's name; the
control loop speaks to what ``build`` returns through ``executors.contract``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from corral.executors.contract import Executor, Wake
    from corral.settings import Settings

ENTRY_POINT_GROUP = "corral.infras"
# the embedded default, always present: it runs what no other infra claims (the declared nodes
# and this machine) and keeps the server's copy of every job's discovery files
DEFAULT = "local"

# corral's own infras, by the module holding each one's INFRA
BUILTIN = {"local": "corral.executors.local.plugin", "ray": "corral.executors.ray.plugin",
           "slurm": "corral.executors.slurm.plugin"}


@dataclass(frozen=True)
class Infra:
    """One infra, as the site and the server see it."""

    name: str
    # the section under ``infra:`` in config.yaml (a pydantic model; extra fields are errors)
    config: type[BaseModel]
    # the executor, given the server's settings, the infra's validated section, the declared
    # nodes (``nodes:``) and the loop's wake-up call
    build: Callable[[Settings, Any, list, Wake], Executor]
    # the node-name patterns of a partition with ``infra: <name>``, from what the partition
    # wrote and the declared node names (default: as written)
    partition_nodes: Callable[[Any, tuple[str, ...], list[str]], tuple[str, ...]] | None = None
    # nodes may join its pool at run time (a partition of it is not checked against the
    # declared nodes); the function says whether, with this section, they join now
    runtime_nodes: Callable[[Any], bool] | None = None
    # each job of its partitions gets nodes provisioned for it alone (``Provisioner``)
    provisions: bool = False
    # the section the infra takes without one in config.yaml, from the environment the
    # server starts in (a server inside a Slurm allocation uses it), or None
    implied: Callable[[], Any] | None = None
    # the pool is only what this infra reports (the declared or local machine is not a node)
    replaces_pool: Callable[[Any], bool] | None = None
    # problems with its section, as (path under the file, message) pairs
    check: Callable[[Any, list[str]], list[tuple[tuple, str]]] | None = None
    # the one Unix account all its workers run as, with this section (a Ray cluster's user): its
    # partitions accept only that account's jobs; None (the default): it starts each replica as
    # its job's account
    runs_as: Callable[[Any], str] | None = None
    # what its nodes would refuse of a job's file_mounts, said at submission rather than once
    # the job has queued: {remote path: sentence}, from its section, the directory of the jobs'
    # records and the task's (remote, source) pairs
    mounts_check: Callable[[Any, Path, list[tuple[str, str]]], dict[str, str]] | None = None


@cache
def infras() -> dict[str, Infra]:
    """Every known infra, corral's own first, then those other packages registered."""
    out: dict[str, Infra] = {}
    for name, module in BUILTIN.items():
        out[name] = importlib.import_module(module).INFRA
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in out:
            continue  # corral's own win: a plugin cannot replace one by taking its name
        infra = entry.load()
        if not isinstance(infra, Infra) or infra.name != entry.name:
            raise TypeError(f"entry point {entry.name!r} of group {ENTRY_POINT_GROUP!r} must be an "
                            f"corral.executors.registry.Infra named {entry.name!r}")
        out[entry.name] = infra
    return out


def infra(name: str) -> Infra:
    return infras()[name]
