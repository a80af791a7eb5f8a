"""Executors: where replicas run. One folder per infra (``local``: processes on this
machine, the embedded default; ``ray``: a Ray cluster; ``slurm``: job steps in Slurm
allocations), each behind the contract in ``contract`` and found through ``registry``
(open to other packages by entry point). ``build`` makes the executors a site uses. Kept
light: a Ray actor's worker imports this package."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the contract pulls in the spec models: too slow for every Ray actor's worker
    from corral.executors.contract import Executor
    from corral.settings import Settings


def scope_of(settings: Settings) -> str:
    """One name per CORRAL_HOME, so two servers' cgroups, Ray actors and files never mix."""
    return hashlib.sha1(str(settings.home).encode()).hexdigest()[:10]


def build(settings: Settings, site, wake: Callable[[], None]) -> dict[str, Executor]:
    """One executor per infra the site uses, keyed by the infra's name."""
    from corral.executors.registry import infras

    known = infras()
    return {name: known[name].build(settings, section, site.nodes, wake) for name, section in site.infras.items()}
