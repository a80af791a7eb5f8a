"""Housekeeping of CORRAL_HOME, like Slurm's MinJobAge and Kubernetes'
ttlSecondsAfterFinished: the logs and checkpoint directories of jobs that ended longer ago
than the site's retention are removed (their records stay in the database for accounting),
and replica logs and the server log are rotated when they pass a size cap (copy then
truncate, as logrotate's copytruncate: the writer keeps its descriptor and appends at the
new end). Runs on its own thread, so a large sweep never stalls the control loop."""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from corral.settings import Settings
from corral.store.tables import Job

log = logging.getLogger("corral.retention")


@dataclass(frozen=True)
class Retention:
    logs_s: float = 30 * 86400.0  # inf: keep forever
    checkpoints_s: float = 30 * 86400.0
    max_log_bytes: int = 100 * 2**20
    every_s: float = 60.0


def rotate(path: Path, cap: int) -> bool:
    """Copy a log past ``cap`` bytes to ``NAME.1`` (replacing the previous one) and truncate
    it in place; returns whether it did."""
    try:
        if path.stat().st_size <= cap:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        with open(path, "r+b") as fh:
            fh.truncate(0)
        return True
    except OSError:
        return False


def expired(settings: Settings, session: Session, now: float, policy: Retention) -> list[Path]:
    """Directories of ended jobs past their retention."""
    out: list[Path] = []
    for root, age in ((settings.logs_dir, policy.logs_s), (settings.checkpoints_dir, policy.checkpoints_s)):
        if math.isinf(age) or not root.is_dir():
            continue
        ids = {int(p.name): p for p in root.iterdir() if p.is_dir() and p.name.isdigit()}
        if not ids:
            continue
        cutoff = now - age
        numbers = sorted(ids)
        for start in range(0, len(numbers), 500):
            chunk = numbers[start:start + 500]
            for job_id, ended_at in session.execute(select(Job.id, Job.ended_at).where(Job.id.in_(chunk))):
                if ended_at is not None and ended_at < cutoff:
                    out.append(ids[job_id])
    return out


class Housekeeper:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], policy: Retention,
                 live_logs: Callable[[], list[str]], clock: Callable[[], float] = time.time):
        self.settings, self.sessions, self.policy = settings, sessions, policy
        self.live_logs, self.clock = live_logs, clock
        self.removed = 0
        self.rotated = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="corral-housekeeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sweep(self) -> None:
        for path in [self.settings.server_log, *map(Path, self.live_logs())]:
            if rotate(path, self.policy.max_log_bytes):
                self.rotated += 1
        with self.sessions() as s:
            old = expired(self.settings, s, self.clock(), self.policy)
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
            self.removed += 1
        if old:
            log.info("removed %d directories of jobs past their retention", len(old))

    def _run(self) -> None:
        while not self._stop.wait(self.policy.every_s):
            try:
                self.sweep()
            except Exception:  # housekeeping must never take the server down
                log.exception("housekeeping failed")
