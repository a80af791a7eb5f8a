"""What reaches the loop from outside its thread: jobs just stored by the intake
(``Submitted``), and the changes users ask for through the API (``Change``: cancel, hold,
release, requeue, scale, priority). They are queued here and taken at the start of each
cycle, on the loop's thread, so nothing else ever touches the loop's memory.

A change is carried out in the loop's own transaction: the store's compare-and-swap (a
cancel only of a job not over, a hold only of a pending one…), its event, its audit entry and
what the loop does about it commit together, and the caller's future is answered only once
that commit is done. A cycle that fails gives its changes back to be carried out again; a
caller who waits too long is told to try again, and nothing was half done."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.queue import Queue
from corral.control.records import JobRec, load_records
from corral.control.scaling import Scaling
from corral.control.transitions import Transitions
from corral.states import JobState
from corral.store import repository
from corral.store.tables import Job

# (session, who, action, target, outcome, detail): writes an audit entry in the session's transaction
Audit = Callable[[Session, Any, str, str | None, str, str | None], None]


@dataclass(frozen=True)
class Submitted:
    job: JobRec


@dataclass(frozen=True)
class Outcome:
    """What became of a change: whether it changed anything, and the job as it is after it."""

    changed: bool
    state: str | None = None
    hold: str = ""
    cancelling: bool = False
    requeueing: bool = False
    refused: bool = False  # an operator's hold stands (released by its owner meanwhile)
    ids: tuple[int, ...] = ()  # a cancel: the jobs it changed


@dataclass(eq=False)
class Change:
    """A change an API caller asked for, as ``who`` (an ``auth.roles.Identity``)."""

    who: Any
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class CancelJobs(Change):
    job_ids: tuple[int, ...] = ()
    target: str = ""  # what the audit names: "job 7", "job 7 (array)"
    force: bool = False  # SIGKILL now, no grace period (also for a job already in it)


@dataclass(eq=False)
class SetHold(Change):
    job_id: int = 0
    kind: str = ""  # "user" or "admin": hold; "": release
    operator: bool = False  # a release by an operator lifts an operator's hold too


@dataclass(eq=False)
class AskRequeue(Change):
    job_id: int = 0
    hold: str = ""  # hold it once pending again ("user" or "admin")


@dataclass(eq=False)
class ScaleTask(Change):
    job_id: int = 0
    task: str = ""
    replicas: int = 0
    bounds: tuple[int, int] | None = None  # new elastic bounds (min, max), checked by the API
    why: str = ""  # what the bounds mean, for the event (a bare count pins an autoscaled task)
    fixed: bool = False  # a fixed-count task's new count, kept in its spec (what a requeue starts)


@dataclass(eq=False)
class SetPriority(Change):
    job_id: int = 0
    values: dict = field(default_factory=dict)  # priority and/or nice


Command = Submitted | Change


class Commands:
    def __init__(self, book: Book, moves: Transitions, queue: Queue, scaling: Scaling, audit: Audit | None = None):
        self.book, self.moves, self.queue, self.scaling = book, moves, queue, scaling
        self.audit = audit
        self._inbox: deque[Command] = deque()
        self._taken: list[list] = []  # [change, its outcome] carried out this cycle, answered once committed
        self.rescan = False  # a command asks for the store's pending jobs to be read again

    def put(self, command: Command) -> None:
        self._inbox.append(command)  # deque appends are atomic: safe from any thread

    def __bool__(self) -> bool:
        return bool(self._inbox)

    def take(self, s: Session, now: float) -> tuple[list[int], list[int]]:
        """Carry out what was queued; returns the jobs to cancel and to requeue (done in their
        own steps, after what executors observed)."""
        cancels: list[int] = []
        requeues: list[int] = []
        while self._inbox:
            command = self._inbox.popleft()
            if isinstance(command, Submitted):
                if not command.job.hold:  # submitted held: it joins the queue when released
                    self.queue.enqueue(command.job, now)
                continue
            if not command.future.running() and not command.future.set_running_or_notify_cancel():
                continue  # its caller stopped waiting before the loop got to it: never done
            taken = [command, None]
            self._taken.append(taken)  # given back by ``lost`` even if carrying it out fails half-way
            taken[1] = self._carry_out(s, command, now, cancels, requeues)
        return cancels, requeues

    def committed(self) -> None:
        """The cycle that carried the changes out is committed: their callers are answered."""
        taken, self._taken = self._taken, []
        for change, outcome in taken:
            if outcome is not None and not change.future.done():
                change.future.set_result(outcome)

    def lost(self) -> None:
        """The cycle's writes were lost: its changes are carried out again by the next one."""
        taken, self._taken = self._taken, []
        for change, _ in reversed(taken):
            self._inbox.appendleft(change)

    def _carry_out(self, s: Session, c: Change, now: float, cancels: list[int], requeues: list[int]) -> Outcome:
        user = c.who.user
        if isinstance(c, CancelJobs):
            changed = tuple(repository.request_cancels(s, list(c.job_ids), now, user))
            forced = self._force(c.job_ids, now, user) if c.force else ()
            self._audit(s, c, "cancel --force" if c.force else "cancel",
                        c.target + (f" ({len(changed)} element(s))" if len(c.job_ids) > 1 else ""),
                        "ok", None if changed or forced else "already ended or cancelling")
            cancels.extend(changed)
            changed = tuple(dict.fromkeys(changed + forced))
            return Outcome(bool(changed), ids=changed)
        if isinstance(c, ScaleTask):
            job = self.book.active.get(c.job_id)
            if c.bounds is not None:
                task = job.task(c.task) if job is not None else None
                before = task.service if task is not None else None
                stored = repository.set_replica_bounds(s, c.job_id, c.task, *c.bounds)
                if task is not None:
                    task.spec = stored
                    task.__dict__.pop("service", None)  # read again from the new bounds
                was = "" if before is None else \
                    f"{before.min_nodes if before.min_nodes is not None else task.num_nodes}.." \
                    f"{before.max_nodes or task.num_nodes} -> "
                repository.add_event(s, c.job_id, now, c.task, "scale_bounds",
                                     message=f"{user} set its bounds: {was}{c.bounds[0]}..{c.bounds[1]} replicas"
                                             + (f": {c.why}" if c.why else ""))
                self._audit(s, c, "scale", f"job {c.job_id}", "ok",
                            f"task {c.task} bounds {c.bounds[0]}..{c.bounds[1]}")
            if c.fixed:
                stored = repository.set_fixed_replicas(s, c.job_id, c.task, c.replicas)
                task = job.task(c.task) if job is not None else None
                if task is not None:
                    task.spec = stored
                    task.__dict__.pop("service", None)
            current = job.task(c.task).num_nodes if job is not None else None
            repository.set_desired_replicas(s, c.job_id, c.task, c.replicas)
            if c.bounds is None or c.replicas != current:  # new bounds alone move no count: said above
                repository.add_event(s, c.job_id, now, c.task, "scale_requested",
                                     message=f"{user} asked for {c.replicas} replica(s)")
                self._audit(s, c, "scale", f"job {c.job_id}", "ok", f"task {c.task} to {c.replicas} replica(s)")
            if job is not None and c.replicas != current:
                self.scaling.reconcile(s, job, c.task, c.replicas, now)
            return Outcome(True)
        if isinstance(c, SetHold):
            changed = repository.set_hold(s, c.job_id, c.kind, now, user, c.operator)
            row = self._row(s, c.job_id)
            if c.kind:
                self._audit(s, c, "hold", f"job {c.job_id}", "ok" if changed else "failed",
                            f"{c.kind} hold" if changed else f"not held: {row.state}, hold {row.hold or 'none'}")
                if changed:
                    self.queue.leave(c.job_id)  # its reason shows again once released
                return self._outcome(changed, row)
            refused = not changed and row.hold == "admin" and not c.operator  # an operator held it meanwhile
            self._audit(s, c, "release", f"job {c.job_id}", "refused" if refused else "ok",
                        "held by an operator" if refused else None if changed else "was not held")
            if changed:
                self.rescan = True  # read back into the queue
            return Outcome(changed, row.state, row.hold, refused=refused)
        if isinstance(c, AskRequeue):
            changed = repository.request_requeue(s, c.job_id, now, user, c.hold)
            row = self._row(s, c.job_id)
            self._audit(s, c, "requeue", f"job {c.job_id}", "ok" if changed or row.requeue_requested_at else "failed",
                        (f"then {c.hold} hold" if c.hold else None) if changed else f"not requeued: {row.state}")
            if changed:
                requeues.append(c.job_id)
            return self._outcome(changed, row)
        if isinstance(c, SetPriority):
            changed = repository.set_priority(s, c.job_id, now, user, **c.values)
            row = self._row(s, c.job_id)
            detail = ", ".join(f"{k} {v}" for k, v in c.values.items())
            self._audit(s, c, "priority", f"job {c.job_id}", "ok" if changed else "failed",
                        detail if changed else f"{detail} not applied: {row.state}")
            if changed:  # read back, with its new priority
                self.queue.leave(c.job_id)
                self.book.sched_needed = self.rescan = True
            return self._outcome(changed, row)
        raise TypeError(f"no way to carry out {c!r}")  # pragma: no cover - a change kind without a case

    @staticmethod
    def _row(s: Session, job_id: int):  # noqa: ANN205 - a Row of the job's columns the caller reports
        return s.execute(select(Job.state, Job.hold, Job.cancel_requested_at, Job.requeue_requested_at)
                         .where(Job.id == job_id)).one()

    @staticmethod
    def _outcome(changed: bool, row) -> Outcome:  # noqa: ANN001
        return Outcome(changed, row.state, row.hold or "", row.cancel_requested_at is not None,
                       row.requeue_requested_at is not None)

    def _audit(self, s: Session, c: Change, action: str, target: str, outcome: str, detail: str | None) -> None:
        if self.audit is not None:
            self.audit(s, c.who, action, target, outcome, detail)

    @staticmethod
    def requested_cancels(s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.cancel_requested_at.is_not(None),
            Job.state.in_([JobState.PENDING.value, JobState.STARTING.value, JobState.RUNNING.value]))))

    @staticmethod
    def requested_requeues(s: Session) -> list[int]:
        return list(s.scalars(select(Job.id).where(
            Job.requeue_requested_at.is_not(None),
            Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value]))))

    def _force(self, job_ids: tuple[int, ...], now: float, user: str) -> tuple[int, ...]:
        """``cancel --force``: the job's stops give no grace period, and replicas already in
        theirs are SIGKILLed at the cycle's end (their ``kill_at`` journalled as now)."""
        forced = []
        for job_id in job_ids:
            job = self.book.active.get(job_id)
            if job is None:
                continue  # pending (cancelled at once) or over: nothing runs
            job.force_kill = True
            forced.append(job_id)
            for replica in job.replicas:
                if replica.kill_at is not None and replica.handle is not None and replica.kill_at > now:
                    replica.kill_at = now
                    self.moves.journal.replica(replica.id, kill_at=now)
            self.moves.event(job_id, now, "job", "cancel", f"cancel --force by {user}: SIGKILL now, no grace period")
            self.book.wake_at(now, job_id)
            self.book.dirty.add(job_id)
        return tuple(forced)

    def cancel(self, s: Session, job_ids: list[int], now: float) -> None:
        """A pending job ends CANCELLED at once; an active one is marked, and stops (every
        replica with its grace period) when its job is evaluated this cycle."""
        book = self.book
        for job_id in job_ids:
            if job_id in book.cancels_seen:
                continue
            if job_id in book.active:
                book.cancels_seen.add(job_id)
                book.active[job_id].cancel_requested = True
                book.dirty.add(job_id)
                continue
            self.queue.leave(job_id)
            job = load_records(s, [job_id]).get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue  # not ours yet or already over; the rescan looks again
            book.cancels_seen.add(job_id)
            self.moves.kill_all(job, JobState.CANCELLED, now, "cancel", "cancelled while pending")
