"""Signals to a replica's Slurm step, and the record of an attempt they act on.

A stop signal reaches the attempt's process group from a small step beside it
(``sidesteps``); SIGKILL cancels the step and ends what it leaves on its node; an attempt
still waiting for its step is ended by killing its srun client (the step then never starts).
The step is looked up off the loop's thread, so a Slurm slow to answer never holds the loop.

While Slurm's controller does not answer, the step cannot be named, and killing our srun
client would leave it running unseen. srun itself still reaches its step through the nodes'
slurmd: it passes on USR1, USR2, CONT and ALRM as they are, and on SIGTERM kills every
process of the step. So a SIGKILL becomes that SIGTERM, and a stop signal waits for Slurm to
answer (the SIGKILL after the grace period does not)."""

from __future__ import annotations

import logging
import os
import signal as signals
import subprocess
import threading
import time
from dataclasses import dataclass

from corral.executors.contract import LaunchError
from corral.executors.slurm.allocations import Allocations
from corral.executors.slurm.cli import SlurmCli, SlurmError, process_alive
from corral.executors.slurm.controller import Controller
from corral.executors.slurm.sidesteps import SideSteps, fail, retrying
from corral.node import container as containers
from corral.node.runner import NodeRunner

log = logging.getLogger("corral.srun")

SIGNAL_RETRY_S = 1.0  # how often a stop signal waiting for Slurm's controller asks it again
FORWARDED = (signals.SIGUSR1, signals.SIGUSR2, signals.SIGCONT, signals.SIGALRM)  # srun passes these on as they are


@dataclass
class Attempt:
    key: str
    slurm_id: str
    node: str
    step: str  # the step's name in Slurm
    proc: subprocess.Popen | None = None  # our srun client, while this server started it
    pid: int = 0
    pid_started: float | None = None
    ending: float | None = None  # when its main process was seen ended while its step still ran
    step_cancelled: bool = False  # its step outlived the replica's end and was cancelled
    gone_since: float | None = None  # when its step was first found gone
    # started here and not yet seen running in its step: confirmed (STARTED, with the GPUs Slurm
    # bound) once the wrapper recorded its start
    unconfirmed: dict | None = None


class StepSignals:
    def __init__(self, cli: SlurmCli, controller: Controller, runner: NodeRunner, allocations: Allocations,
                 side: SideSteps):
        self.cli, self.controller, self.runner, self.allocations, self.side = cli, controller, runner, allocations, side

    def send(self, attempt: Attempt, signum: int) -> bool:
        """Signal ``attempt`` (from another thread); False if it has nothing left to signal.
        True even when it is not delivered: the loop then arms the SIGKILL deadline, so a stop
        is never silently dropped."""
        if not (attempt.slurm_id or self.srun_alive(attempt)):
            return False
        threading.Thread(target=self._deliver, args=(attempt, signum), daemon=True,
                         name=f"corral-srun-signal-{attempt.key}").start()
        return True

    @staticmethod
    def srun_alive(attempt: Attempt) -> bool:
        return bool(attempt.pid) and process_alive(attempt.pid, attempt.pid_started)

    def _deliver(self, attempt: Attempt, signum: int) -> None:
        step_id, answered = None, False
        if attempt.slurm_id and self.controller.why is None:  # (one known not to answer is not asked)
            try:
                step_id = retrying(lambda: self.cli.steps([attempt.slurm_id]).get(attempt.step))
                answered = True
            except SlurmError as exc:
                log.warning("could not find the step of %s to signal it: %s", attempt.key, exc)
        if step_id:
            if signum == signals.SIGKILL:
                retrying(lambda: self.cli.cancel(step_id) or fail("scancel failed"), quiet=True)
                self._reap(attempt)
                self._kill_srun(attempt)
            else:
                self._signal_step(attempt, step_id, signum)
            return
        if answered or self.runner.started_pid(attempt.key) is None:
            self._kill_srun(attempt)  # no step yet: it never starts
            return
        if not self.srun_alive(attempt):
            return
        if signum == signals.SIGKILL:
            os.kill(attempt.pid, signals.SIGTERM)  # srun kills every process of its step
        elif signum in FORWARDED:
            os.kill(attempt.pid, signum)
        else:
            self._signal_when_answered(attempt, signum)

    def _signal_step(self, attempt: Attempt, step_id: str, signum: int) -> None:
        try:
            _, host, _ = self.allocations.where(attempt.node)
        except LaunchError:
            host = ""
        self.side.signal_group(attempt.slurm_id, host, self.runner.started_pid(attempt.key), attempt.key, step_id,
                               signals.Signals(signum).name.removeprefix("SIG"),
                               str(self.runner.run_dir(attempt.key) / containers.NAME_FILE))

    def _kill_srun(self, attempt: Attempt) -> None:
        if self.srun_alive(attempt):
            try:
                os.kill(attempt.pid, signals.SIGKILL)
            except ProcessLookupError:
                pass

    def _signal_when_answered(self, attempt: Attempt, signum: int) -> None:
        """Deliver a stop signal once Slurm's controller says which the attempt's step is (or
        give up when the attempt ends, its SIGKILL having ended the step)."""
        while self.srun_alive(attempt):
            time.sleep(SIGNAL_RETRY_S)
            if self.controller.why is not None:
                continue
            try:
                step_id = self.cli.steps([attempt.slurm_id]).get(attempt.step)
            except SlurmError:
                continue
            if step_id:
                self._signal_step(attempt, step_id, signum)
            return

    def _reap(self, attempt: Attempt) -> None:
        """End what a killed step leaves on its node (``sidesteps``)."""
        try:
            _, host, _ = self.allocations.where(attempt.node)
        except LaunchError:
            return  # the allocation is over: Slurm ended what ran in it
        self.side.reap(attempt.slurm_id, host, attempt.key,
                       str(self.runner.run_dir(attempt.key) / containers.NAME_FILE))
