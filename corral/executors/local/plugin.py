"""The ``local`` infra: replicas are processes on the server's machine, on the nodes
``config.yaml`` declares (``nodes:``) or on this machine itself. Always present."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field

from corral.executors.registry import Infra
from corral.spec.base import Strict


class LocalConfig(Strict):
    """``infra: {local: {network: host|namespace}}``; the pool itself is ``nodes:``."""

    # host: replicas share the machine's network, each on its own loopback address;
    # namespace: each in a network namespace of its own on a bridge (0.0.0.0 is its own)
    network: Literal["host", "namespace"] = Field("host", description="host or namespace")


def _build(settings, config, nodes, wake):  # noqa: ANN001 - see Infra.build
    from corral.executors import scope_of
    from corral.executors.local.executor import LocalExecutor

    return LocalExecutor(nodes, settings, scope_of(settings), wake,
                         network=getattr(config, "network", "host"))


def _partition_nodes(config, patterns: tuple[str, ...], declared: list[str]) -> tuple[str, ...]:  # noqa: ANN001
    # only declared nodes are local; a pattern that matches none leaves the partition empty
    return tuple(n for n in declared if any(fnmatch.fnmatchcase(n, p) for p in patterns)) or ("\0none",)


INFRA = Infra(name="local", config=LocalConfig, build=_build, partition_nodes=_partition_nodes)
