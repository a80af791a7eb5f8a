"""corral: one orchestrator for AI job groups — Slurm-grade gang scheduling with
Kubernetes-style services, SkyPilot-compatible YAML. See DESIGN.md for the layers."""

__version__ = "0.1.0"
