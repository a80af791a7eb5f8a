"""Where corral keeps its state and how it is reached: ``CORRAL_HOME`` (default
``~/.corral``) with the SQLite database, logs, ``config.yaml`` and ``server.json``;
``CORRAL_DB_URL`` for a shared PostgreSQL; ``CORRAL_SERVER`` for a remote API."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str
    server_url: str | None = None
    poll_interval_s: float = 0.5  # safety net; the loop is woken by events first
    rescan_interval_s: float = 1.0  # how often the loop re-reads pending jobs and cancels
    min_cycle_interval_s: float = 0.04  # a busy loop batches what arrives within this window
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env.get("CORRAL_HOME") or Path.home() / ".corral").expanduser().resolve()
        db_url = env.get("CORRAL_DB_URL") or f"sqlite:///{home / 'corral.db'}"
        return cls(home=home, db_url=db_url, server_url=env.get("CORRAL_SERVER") or None)

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def runs_dir(self) -> Path:
        """Per-replica bookkeeping of the local executor (pid and exit files)."""
        return self.home / "runs"

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def server_file(self) -> Path:
        return self.home / "server.json"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"

    def ensure_dirs(self) -> None:
        for path in (self.home, self.logs_dir, self.runs_dir, self.checkpoints_dir):
            path.mkdir(parents=True, exist_ok=True)
