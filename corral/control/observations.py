"""What the executors observed, drained each cycle: attempts that started (a late
confirmation, or adopted after a restart), exited with a code, were lost with a reason, or
never started (ABSENT: launched anew under a new key). Each end goes to the supervisor,
whose decisions the carrier carries out.

Drained events are kept until the cycle that applied them is committed: a cycle whose
writes are lost gives them back (``restore``), so an exit observed then is applied again
after recovery, never lost. An event for an attempt that is nobody's (an older attempt's, a
job that ended) is ignored if it ended, and its attempt killed if it runs: never alive twice."""

from __future__ import annotations

import logging

from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.inventory import Inventory
from corral.control.launcher import Launcher
from corral.control.records import JobRec
from corral.control.supervisor import AttemptEnded, Supervisor
from corral.control.transitions import Transitions
from corral.executors.contract import Kind, Observed
from corral.runtime.logs import last_words
from corral.states import ReplicaState

log = logging.getLogger("corral.control")


class Observations:
    def __init__(self, book: Book, moves: Transitions, inventory: Inventory, carrier: Carrier, launcher: Launcher,
                 supervisor: Supervisor):
        self.book, self.moves, self.inventory = book, moves, inventory
        self.carrier, self.launcher, self.supervisor = carrier, launcher, supervisor
        self._uncommitted: list[tuple[str, Observed]] = []  # applied this cycle, not yet durable
        self._replay: list[tuple[str, Observed]] = []  # from a cycle whose writes were lost
        self.recovering = "a server restart"  # what an adopted attempt's event says it survived

    def collect(self, now: float, quarantine) -> None:  # noqa: ANN001 - Loop.quarantine
        """Apply everything observed since the last cycle (and what a lost cycle had applied)."""
        events, self._replay = self._replay, []
        for infra, executor in list(self.inventory.executors.items()):
            events.extend((infra, e) for e in executor.drain())
        for infra, event in events:
            self._uncommitted.append((infra, event))
            try:
                self._observed(infra, event, now)
            except Exception as exc:  # one job's surprise must not stop the loop for all
                log.exception("handling %s of %s failed; failing its job", event.kind.value, event.key)
                job_id = self.book.by_key.get(event.key, (None, None))[0]
                if job_id is None:
                    try:
                        job_id = int(event.key.split(".", 1)[0])
                    except ValueError:
                        continue
                quarantine(self.book.active.get(job_id), exc, now)

    def committed(self) -> None:
        self._uncommitted.clear()

    def restore(self) -> None:
        """The cycle's writes were lost: what it applied is applied again next time."""
        self._replay = self._uncommitted + self._replay
        self._uncommitted = []

    def _observed(self, infra: str, event: Observed, now: float) -> None:
        job, replica = self.book.replica_of(event.key)
        if replica is None:
            if event.kind == Kind.STARTED and event.handle is not None:
                # an attempt that runs but is nobody's any more: never alive twice
                self.carrier.effects.kill(infra, event.handle, f"stray attempt {event.key}")
            return
        if event.kind == Kind.STARTED:
            self._started(infra, job, replica, event, now)
            if event.key in self.book.departed and event.handle is not None:  # on a node that left the site
                self.book.departing[event.key] = self.book.departed.pop(event.key)
                self.carrier.effects.kill(infra, event.handle, f"{replica.label}: {self.book.departing[event.key]}")
            return
        self.book.departed.pop(event.key, None)  # it ended by itself: its own exit stands
        departed = self.book.departing.pop(event.key, None)
        if departed is not None:  # ended by corral because its node left the site
            event = Observed(event.key, Kind.LOST, reason=departed, node=replica.node)
        self.book.by_key.pop(event.key, None)
        self.book.unconfirmed.discard(replica.id)
        if event.kind == Kind.ABSENT:
            if replica.state == ReplicaState.STARTING:
                # Never ran: a fresh attempt, under a new key committed before it launches.
                replica.handle, replica.attempt = None, replica.attempt + 1
                self.moves.journal.replica(replica.id, handle=None, attempt=replica.attempt)
                self.book.launch_check.add(job.id)
                return
            event = Observed(event.key, Kind.LOST, reason=event.reason, node=event.node)
        self.carrier.forget_attempt(event.key)
        handle, replica.handle = replica.handle, None
        if handle is not None:
            self.carrier.effects.forget(infra, handle)  # once the end is committed
        if replica.state.terminal:
            return
        self.book.publish.add(job.id)
        self.book.launch_check.add(job.id)  # a task may wait for this one to succeed
        self.book.dirty.add(job.id)
        lost = event.kind == Kind.LOST
        if lost and event.node and self.inventory.refresh():  # its node may have left: never restart there
            self.book.sched_needed = True
        reason = event.reason
        if event.kind == Kind.EXITED and event.code and not reason:  # what corral's shell said, if it failed it
            reason = last_words(self.launcher.settings.log_file(job.id, replica.label), code=event.code)
        ended = AttemptEnded(replica.id, event.code if event.kind == Kind.EXITED else None, lost, reason,
                             self.inventory.up(replica.node), event.kind == Kind.EXITED and event.permanent,
                             unverified=lost and event.unverified)
        self.carrier.apply(job, self.supervisor.attempt_ended(job, replica, ended, now), now)

    def _started(self, infra: str, job: JobRec, replica, event: Observed, now: float) -> None:  # noqa: ANN001
        """A start the engine confirmed late, or an attempt adopted (after a restart, or after
        a cycle whose writes were lost)."""
        launched = replica.id in self.book.unconfirmed
        self.book.unconfirmed.discard(replica.id)
        replica.handle, replica.infra = event.handle, infra
        if replica.state == ReplicaState.STARTING:
            survived = f"running after {self.recovering}" + (f" ({event.detail})" if event.detail else "")
            self.launcher.running(job, replica, event.handle, now, "launched" if launched else "adopted",
                                  None if launched else survived, gpus=event.gpus, detail=event.detail)
            return
        self.moves.journal.replica(replica.id, handle=event.handle, infra=infra)
        self.moves.event(job.id, now, replica.label, "adopted", f"running after {self.recovering}")
        if replica.kill_at is not None:
            self.book.wake_at(replica.kill_at, job.id)
        self.launcher.watch_probes(job, replica)
        self.carrier.arm(job, replica)
