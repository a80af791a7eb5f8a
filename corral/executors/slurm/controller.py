"""Whether Slurm's controller answers this server: the Slurm infra's ``Reachability``.

``scontrol ping`` asks slurmctld itself and answers at once either way (``squeue`` retries
an unreachable controller for up to a minute, and ``squeue -j 0`` never asks it). Its answer
becomes a sentence naming what failed: no configuration found (``SLURM_CONF`` not in the
server's environment, or naming no file), the commands missing from PATH, or the controller
not answering at the address the configuration gives. While Slurm answers it is asked again
every few seconds; while it does not, with a growing pause, so a controller that comes back
is noticed within half a minute and one that stays down costs one cheap call now and then.
Checks run on the executor's own threads (its watcher until the server has connected, then a
pinger of their own, so a watcher waiting on a retrying ``squeue`` never delays one), never on
the control loop's."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable

from corral.executors.slurm.cli import SlurmCli

PING_TIMEOUT_S = 10.0
CHECK_EVERY_S = 5.0  # while the controller answers
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # while it does not: pauses between checks


class Controller:
    """What the last check of Slurm's controller found; ``why`` is None while it answers."""

    def __init__(self, cli: SlurmCli, changed: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        self.cli, self._changed, self._clock = cli, changed, clock
        self._lock = threading.Lock()
        self.why: str | None = "Slurm's controller has not been asked yet"
        self._failures = 0
        self._next = 0.0

    def due(self) -> bool:
        return self._clock() >= self._next

    def check(self) -> bool:
        """Ask the controller now; True if it answers."""
        why = self.probe()
        if why is None:
            self.answered()
        else:
            self.failed(why)
        return why is None

    def answered(self) -> None:
        with self._lock:
            was, self.why, self._failures = self.why, None, 0
            self._next = self._clock() + CHECK_EVERY_S
        if was is not None:
            self._changed()

    def failed(self, why: str) -> None:
        """Slurm does not answer (or answered that it cannot be used): ask again after a pause."""
        with self._lock:
            was, self.why = self.why, why
            self._next = self._clock() + BACKOFF_S[min(self._failures, len(BACKOFF_S) - 1)]
            self._failures += 1
        if was != why:
            self._changed()

    def probe(self) -> str | None:
        conf = self.cli.env.get("SLURM_CONF")
        where = f" (SLURM_CONF={conf})" if conf else ""
        if conf and not os.path.isfile(conf):
            return f"Slurm cannot be reached: SLURM_CONF names {conf}, which is not a file"
        try:
            done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_TIMEOUT_S,
                                  env=self.cli.env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"Slurm's controller does not answer: scontrol ping got no answer in {PING_TIMEOUT_S:g}s{where}"
        except OSError as exc:
            return f"Slurm cannot be reached: its commands are not usable here (scontrol: {exc.strerror or exc})"
        said = " ".join((done.stdout + " " + done.stderr).split())
        if done.returncode == 0 and " is UP" in done.stdout:
            return None
        if "configuration source" in said or "Unable to process configuration file" in said or \
                "could not open" in said.lower():
            missing = "" if conf else ": SLURM_CONF is not set in the server's environment and Slurm found no " \
                                       "configuration of its own (start the server with SLURM_CONF set)"
            return f"Slurm cannot be reached: no Slurm configuration{missing}{where}"
        first = next((part.strip() for part in said.split("*") if part.strip()), "no answer")
        return f"Slurm's controller does not answer: {first[:200]}{where}"
