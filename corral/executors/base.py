"""The contract between the control loop and the places replicas run. An executor starts,
signals, watches and adopts replicas; it keeps no job state of its own, so the store stays
the one source of truth and a restarted server can adopt what is still running."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Launch:
    """Everything needed to run one replica once."""

    key: str  # unique per replica attempt, e.g. "42.trainer.0.r1"
    run_dir: Path  # executor bookkeeping for this attempt (exit file)
    log_path: Path
    setup: str | None
    run: str | None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class Handle:
    """Identifies a running replica: pid plus process start time, never pid alone."""

    key: str
    pid: int
    started_at: float
    run_dir: Path


ExitCallback = Callable[[Handle, "int | None"], None]  # exit code, None when it cannot be known


class Executor(Protocol):
    name: str

    def start(self, launch: Launch) -> Handle: ...

    def signal(self, handle: Handle, signum: int) -> bool:
        """Send ``signum`` to the replica's whole process group; False if it is gone."""
        ...

    def watch(self, handle: Handle) -> None:
        """Report the replica's exit through the callback given at construction (also for
        replicas adopted after a restart)."""
        ...

    def alive(self, handle: Handle) -> bool: ...

    def close(self) -> None: ...
