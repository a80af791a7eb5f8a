"""What the loop's decisions make happen outside the store, done only once the decisions
are committed: a stop signal or a kill sent to an attempt, an attempt's records dropped by
its executor once its end is durable, a job's reservations and files given back once its
end (or requeue) is durable.

A cycle queues effects while it decides; ``run`` carries them out after the commit. A cycle
whose commit fails drops its queue with the rest of its memory (``recovery``): nothing it
decided happened, outside the store or in it.

A signal with a grace period is sent a commit (and, under load, a good part of a second) after
the cycle that decided it; the grace counts from the send, so ``run`` notes when each went out
(``signalled``) and the loop moves the kill deadline to match: a stop never gets less grace
than its task asked for."""

from __future__ import annotations

import logging
import signal as signals
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.control.inventory import Inventory
from corral.executors.contract import Accounting, Handle

log = logging.getLogger("corral.control")


@dataclass(frozen=True)
class SendSignal:
    infra: str
    handle: Handle
    signum: int
    what: str  # "job 12 trainer-0", for the log when it fails
    grace: tuple[int, int, float] | None = None  # (job id, replica id, seconds) the kill waits after the send


@dataclass(frozen=True)
class Forget:
    infra: str
    handle: Handle


@dataclass(frozen=True)
class Release:
    job_id: int
    state: str = ""  # how the job ended ("" when it runs again), for engines that keep accounts


Effect = SendSignal | Forget | Release


class Effects:
    def __init__(self, inventory: Inventory, clock: Callable[[], float] = time.time):
        self.inventory, self.clock = inventory, clock
        self._queue: list[Effect] = []
        # (job id, replica id, the earliest its SIGKILL may come) for each graced signal sent
        self.signalled: list[tuple[int, int, float]] = []
        # (job id, replica id, attempt key) for each graced signal that found its attempt ended
        self.found_ended: list[tuple[int, int, str]] = []

    def signal(self, infra: str, handle: Handle, signum: int, what: str,
               grace: tuple[int, int, float] | None = None) -> None:
        self._queue.append(SendSignal(infra, handle, signum, what, grace))

    def kill(self, infra: str, handle: Handle, what: str) -> None:
        self._queue.append(SendSignal(infra, handle, signals.SIGKILL, what))

    def forget(self, infra: str, handle: Handle) -> None:
        self._queue.append(Forget(infra, handle))

    def release(self, job_id: int, state: str = "") -> None:
        self._queue.append(Release(job_id, state))

    def releasing(self) -> set[int]:
        """Jobs whose release is queued (done after the commit)."""
        return {e.job_id for e in self._queue if isinstance(e, Release)}

    def __bool__(self) -> bool:
        return bool(self._queue)

    def drop(self) -> None:
        """The cycle's writes were lost: what it decided did not happen."""
        self._queue.clear()

    def run(self) -> bool:
        """Carry out what was queued (after the commit that made it durable); True when a job
        was released (the inventory may have changed: provisioned nodes leave with it)."""
        queue, self._queue = self._queue, []
        released = False
        for effect in queue:
            try:
                if isinstance(effect, SendSignal):
                    executor = self.inventory.executors.get(effect.infra)
                    delivered = executor.signal(effect.handle, effect.signum) if executor is not None else True
                    if effect.grace is not None:
                        job_id, replica_id, seconds = effect.grace
                        self.signalled.append((job_id, replica_id, self.clock() + seconds))
                        if delivered is False and effect.handle.get("key"):
                            self.found_ended.append((job_id, replica_id, effect.handle["key"]))
                elif isinstance(effect, Forget):
                    executor = self.inventory.executors.get(effect.infra)
                    if executor is not None:
                        executor.forget(effect.handle)
                else:
                    released = True
                    for executor in list(self.inventory.executors.values()):
                        try:
                            if isinstance(executor, Accounting):
                                executor.record_end(effect.job_id, effect.state)
                            executor.release(effect.job_id)
                            executor.cleanup_job(effect.job_id)
                        except Exception:
                            log.exception("releasing job %s on %s failed", effect.job_id, executor.name)
            except Exception:  # one engine's failure must not keep the rest from happening
                log.exception("carrying out %s failed", effect)
        return released
