"""Stopping a running job to run it again later, under the same id, names and checkpoint
directory (``CORRAL_RESTART_COUNT`` goes up): a requeue asked for (``corral requeue``, or an
engine that requeued a job's nodes), a preemption by the scheduler's plan (each victim by
its partition's or QOS's preempt mode: requeue, or cancel), or a job whose node was lost.

The job goes PREEMPTED at once and every replica gets its stop signal and grace period;
once all have stopped (``finish``) it is PENDING again (or CANCELLED), its reservations
given back. The wish to requeue is in the store, so a restart mid-stop still requeues it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.queue import Queue
from corral.control.records import JobRec
from corral.control.scaling import Scaling
from corral.control.transitions import Transitions
from corral.scheduler import Policy
from corral.scheduler.plan import Reason
from corral.states import JobState, ReplicaState
from corral.store.tables import Job


class Requeues:
    def __init__(self, book: Book, moves: Transitions, carrier: Carrier, queue: Queue, scaling: Scaling,
                 policy: Policy):
        self.book, self.moves, self.carrier, self.queue = book, moves, carrier, queue
        self.scaling, self.policy = scaling, policy

    def requested(self, s: Session, job_ids: list[int], now: float) -> None:
        """A requeue asked for: the job stops as if preempted and, once every replica has
        stopped, is pending again (held, if asked: ``requeue --hold``)."""
        for job_id in job_ids:
            job = self.book.active.get(job_id)
            if job is None or job.state not in (JobState.STARTING, JobState.RUNNING) or job.cancel_requested:
                continue
            job.requeue_requested = True
            job.hold = s.scalar(select(Job.hold).where(Job.id == job.id)) or ""  # requeue --hold
            self.moves.job_to(job, JobState.PREEMPTED, now, "requeue", "requeue requested: stopping every replica"
                              + (" (then held)" if job.hold else ""))
            self._stop_all(job, "requeued", now)

    def evict(self, job_id: int, mode: str, for_job: int, now: float, why: str = "") -> None:
        """A victim of the plan (the applier checked it still runs and took its mode): every
        replica gets its stop signal and grace period; the preemptor starts once their
        resources are free, and ``finish`` requeues or cancels it."""
        job = self.book.active.get(job_id)
        if job is None or job.state not in (JobState.RUNNING, JobState.STARTING):
            return
        then = f"it will be {'requeued' if mode == 'requeue' else 'cancelled'}"
        job.yields_to = for_job
        self.moves.job_to(job, JobState.PREEMPTED, now, "preempted",
                          f"{why}; {then}" if why else f"preempted by job {for_job}; {then}")
        self._stop_all(job, "preempted", now)

    def shrink(self, s: Session, job_id: int, task_name: str, replicas: int, for_job: int, now: float) -> None:
        """An elastic task scaled down to make room (its highest ranks stop, with grace)."""
        job = self.book.active.get(job_id)
        if job is None or job.state not in (JobState.RUNNING, JobState.STARTING):
            return
        task = job.task(task_name)
        self.moves.event(job.id, now, task_name, "shrunk",
                         f"{len(job.replicas_of(task_name))} -> {replicas} replicas to make room "
                         f"for job {for_job} (elastic minimum {task.service.min_nodes})")
        self.moves.journal.task(task.id, num_nodes=replicas)
        shrunk = self.scaling.shrunk_at
        if len(shrunk) > 256:  # forget jobs that ended
            self.scaling.shrunk_at = shrunk = {k: t for k, t in shrunk.items() if k[0] in self.book.active}
        shrunk[(job.id, task_name)] = now  # a growing task waits before it grows again
        self.scaling.reconcile(s, job, task_name, replicas, now)

    def _stop_all(self, job: JobRec, cause: str, now: float) -> None:
        for replica in job.members:
            if not replica.state.terminal and replica.stop_requested_at is None:
                self.carrier.stop(job, replica, cause, now)
        self.book.dirty.add(job.id)

    def finish(self, job: JobRec, now: float) -> None:
        """Once every replica of a preempted job has stopped: requeue it (same id, same
        names, same checkpoint directory; CORRAL_RESTART_COUNT goes up) or cancel it."""
        if any(not r.state.terminal for r in job.members):
            return
        self.book.active.pop(job.id)
        self.book.publish.discard(job.id)
        self.carrier.effects.release(job.id)
        mode = "requeue" if job.requeue_requested else self.policy.preempt_mode(job.partition, job.qos)
        if job.no_requeue and not job.requeue_requested:
            mode = "cancel"
        if mode != "requeue" or job.cancel_requested:
            why = "cancel requested while preempted" if job.cancel_requested else \
                "preempted (--no-requeue)" if job.no_requeue else "preempted (preempt mode cancel)"
            self.moves.job_to(job, JobState.CANCELLED, now, "preempted", why, message=why)
            return
        job.requeues += 1
        for task in job.tasks:  # an elastic task comes back at its initial size: that one fit the pool
            initial = int(task.spec.get("num_nodes") or 1)
            if task.num_nodes == 0:  # a service at zero comes back at its initial size too
                for replica in job.replicas:
                    if replica.task == task.name and replica.retired and replica.rank < initial:
                        replica.stop_cause = None  # a member again: placed with the job
                        self.moves.journal.replica(replica.id, stop_cause=None)
                self.moves.event(job.id, now, task.name, "scaled",
                                 f"0 -> {initial} replicas for the requeue (its initial size)")
                task.num_nodes = initial
                self.moves.journal.task(task.id, num_nodes=initial)
                continue
            if task.service.min_nodes is None or task.num_nodes <= initial:
                continue
            for replica in sorted(job.replicas_of(task.name), key=lambda r: r.rank)[initial:]:
                replica.stop_cause = "scale_down"  # ended already: now retired, out of the gang
                self.moves.journal.replica(replica.id, stop_cause="scale_down")
            self.moves.event(job.id, now, task.name, "scaled",
                             f"{task.num_nodes} -> {initial} replicas for the requeue (its initial size)")
            task.num_nodes = initial
            self.moves.journal.task(task.id, num_nodes=initial)
        for replica in job.members:
            if job.pipeline and replica.state == ReplicaState.SUCCEEDED:
                continue  # a pipeline resumes at the stage it was in; stages done stay done
            replica.restarts += 1
            replica.node, replica.gpus, replica.handle, replica.ready = None, (), None, False
            replica.stop_requested_at = replica.stop_cause = replica.kill_at = replica.exit_code = None
            self.moves.replica_to(replica, ReplicaState.PENDING, "requeued", now, node=None, gpus=[], handle=None,
                                  stop_requested_at=None, stop_cause=None, kill_at=None,
                                  exit_code=None, ended_at=None, ready=False, restarts=replica.restarts)
        for task in job.tasks:
            task.termination_deadline = None
        if job.started_at is not None:  # least attained service counts every attempt, across restarts
            job.attained_gpu_s += job.request.gpus * max(0.0, now - job.started_at)
        job.started_at = None
        job.requeue_requested = False
        job.forget_request()
        held = {"user": Reason.HELD_USER.value, "admin": Reason.HELD_ADMIN.value}.get(job.hold)
        self.moves.job_to(job, JobState.PENDING, now, "requeued", f"requeue {job.requeues}" + (", held" if held else ""),
                          requeues=job.requeues, started_at=None, reason=held or "None", requeue_requested_at=None,
                          attained_gpu_s=job.attained_gpu_s)
        self.queue.enqueue(job, now)
