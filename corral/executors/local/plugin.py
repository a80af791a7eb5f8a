"""The ``local`` infra: replicas are processes on the server's machine, on the nodes
``config.yaml`` declares (``nodes:``) or on this machine itself. Always present."""

from __future__ import annotations

import fnmatch

from corral.executors.registry import Infra
from corral.spec.base import Strict


class LocalConfig(Strict):
    """``infra: {local: {}}`` takes no settings: the pool is ``nodes:``."""


def _build(settings, config, nodes, wake):  # noqa: ANN001 - see Infra.build
    from corral.executors import scope_of
    from corral.executors.local.executor import LocalExecutor

    return LocalExecutor(nodes, settings, scope_of(settings), wake)


def _partition_nodes(config, patterns: tuple[str, ...], declared: list[str]) -> tuple[str, ...]:  # noqa: ANN001
    # only declared nodes are local; a pattern that matches none leaves the partition empty
    return tuple(n for n in declared if any(fnmatch.fnmatchcase(n, p) for p in patterns)) or ("\0none",)


INFRA = Infra(name="local", config=LocalConfig, build=_build, partition_nodes=_partition_nodes)
