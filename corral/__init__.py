"""corral: one orchestrator for AI job groups — Slurm-grade gang scheduling with
Kubernetes-style services, SkyPilot-compatible YAML. See DESIGN.md for the layers."""

__version__ = "0.1.0"


def __getattr__(name: str):  # ``corral.Client`` without importing the client for every ``import corral``
    if name in ("Client", "CorralError"):
        from corral import client

        return getattr(client, name)
    raise AttributeError(f"module 'corral' has no attribute {name!r}")
