"""spec: parses and validates what users write (SkyPilot task and job-group YAML) into frozen
models; every error names its document, field and line, and nothing is stored on error.

The package's names are loaded on first use: the loader brings pydantic and the validators
(a fifth of a second), and the CLI's read commands import light modules of this package
(``corral.spec.jobarray`` to fold array indices) without them."""

from __future__ import annotations

_NAMES = {"LoadedJob": "loader", "SpecError": "loader", "SpecIssue": "loader", "load_job": "loader",
          "JobSpec": "models", "Resources": "models", "TaskSpec": "models"}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(f"corral.spec.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'corral.spec' has no attribute {name!r}")
