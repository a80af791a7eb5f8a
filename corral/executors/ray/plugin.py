"""The ``ray`` infra: replicas run on the nodes of an existing Ray cluster
(``infra: {ray: {address: auto}}``). Its nodes are known only at run time, named
``<node_prefix>-<ip>`` (or the node's ``corral.node`` label). Kept apart from the executor
so the site can read the section without importing Ray."""

from __future__ import annotations

from pydantic import Field

from corral.executors.registry import Infra
from corral.spec.base import Strict


class RayConfig(Strict):
    """A Ray cluster corral runs replicas on: ``auto`` (the cluster this machine belongs
    to), a GCS address ``HOST:PORT``, or ``ray://HOST:PORT`` (Ray Client)."""

    address: str = "auto"
    node_prefix: str = Field(default="ray", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")
    namespace: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,63}$")
    # the Unix account the cluster's workers run as (default: the server's own); Ray cannot
    # start a worker as another account, so its partitions take only this account's jobs
    user: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
    # the largest file_mounts source (file or directory) copied to a node that does not see it
    file_mounts_max_gb: float = Field(default=1.0, gt=0)


def runs_as(config: RayConfig) -> str:
    from corral.auth.accounts import server_account

    return config.user or server_account()


def _build(settings, config: RayConfig, nodes, wake):  # noqa: ANN001 - see Infra.build
    from corral.executors import scope_of
    from corral.executors.ray.executor import RayExecutor  # Ray is an optional extra: imported only here

    return RayExecutor(config, settings, scope_of(settings), wake)


def _partition_nodes(config: RayConfig, patterns: tuple[str, ...], declared: list[str]) -> tuple[str, ...]:
    # all Ray nodes are named under the cluster's prefix, so "*" there means every Ray node
    prefix = config.node_prefix + "-"
    return tuple(p if p.startswith(prefix) else prefix + p for p in patterns)


def _check(config: RayConfig, declared: list[str]) -> list[tuple[tuple, str]]:
    for node in declared:
        if node.startswith(config.node_prefix + "-"):
            return [(("nodes",), f"node {node!r} is named like a Ray node (prefix {config.node_prefix!r}-); "
                                 "rename it or set infra.ray.node_prefix")]
    return []


INFRA = Infra(name="ray", config=RayConfig, build=_build, partition_nodes=_partition_nodes,
              runtime_nodes=lambda config: True,
              check=_check, runs_as=runs_as)
