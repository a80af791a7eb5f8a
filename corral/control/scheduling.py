"""The control loop's side of scheduling and preemption: the snapshot the pure scheduler
reads (free resources, pending jobs, running jobs with expected ends and elastic surplus,
usage, dependency states), the priorities shown by ``corral queue --priority``, and the
application of a plan's preemptions (stop with grace, then requeue keeping the id, or
cancel) and elastic shrinks."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.accounting import Holding
from corral.control.records import JobRec, ReplicaRec
from corral.scheduler import NodeView, PendingJob, Preemption, RunningJob, Shrinkable, Snapshot
from corral.scheduler.placement import FreePool
from corral.scheduler.plan import Allocation, Reason
from corral.scheduler.priority import Factors
from corral.states import JobState, ReplicaState
from corral.store.tables import Job


class SchedulingMixin:
    def free_views(self) -> tuple[NodeView, ...]:
        pool = FreePool(self.views)
        for alloc in list(self._allocs.values()):  # also read from API threads
            pool.assume(alloc)
        return pool.views()

    def snapshot(self, growth: list[PendingJob] | None = None) -> Snapshot:
        """The scheduler's input: free resources, pending jobs in queue order (and replicas
        of running jobs waiting for a place), running jobs (what they hold, their expected
        ends, elastic surplus), usage and dependency states."""
        nodes = self.free_views()
        pending = tuple(growth or ()) + tuple(job.request for job in list(self.pending.values()))
        running = tuple(self._running_view(job) for job in list(self.active.values()))
        return Snapshot(nodes, pending, running, self.ledger.usage(), self.ledger.gpu_minutes(),
                        self._dependency_states(pending), priorities=dict(self.priorities) or None)

    def _running_view(self, job: JobRec) -> RunningJob:
        live = [r for r in job.members if not r.state.terminal and r.id in self._allocs]
        allocations = tuple(self._allocs[r.id] for r in live)
        ends = [job.started_at + limit for t in job.tasks
                if job.started_at is not None and (limit := job.time_limit_of(t)) is not None]
        elastic = []
        for task in job.tasks:
            low = task.service.min_nodes
            mine = sorted((r for r in live if r.task == task.name and r.stop_requested_at is None), key=lambda r: r.rank)
            if low is not None and len(mine) > low and len(mine) == len(job.replicas_of(task.name)):
                elastic.append(Shrinkable(task.name, low, tuple(self._allocs[r.id] for r in mine)))
        ending = job.state == JobState.PREEMPTED or job.cancel_requested or \
            any(t.termination_deadline is not None for t in job.tasks)
        return RunningJob(job.id, allocations, max(ends) if ends else float("inf"), job.user, job.account,
                          job.partition, job.qos, job.started_at or job.submitted_at, job.rank_priority, ending,
                          tuple(elastic), job.name, job.array_job_id)

    def _dependency_states(self, pending: tuple[PendingJob, ...]) -> dict[int, str]:
        wanted = {i for job in pending for dep in job.dependencies for i in dep.job_ids}
        if not wanted:
            return {}
        states: dict[int, str] = {}
        unknown = []
        for job_id in wanted:
            rec = self.active.get(job_id) or self.pending.get(job_id)
            if rec is not None:
                states[job_id] = rec.state.value
            elif job_id in self._ended_states:
                states[job_id] = self._ended_states[job_id]
            else:
                unknown.append(job_id)
        if unknown:
            with self.sessions() as s:
                for job_id, state in s.execute(select(Job.id, Job.state).where(Job.id.in_(unknown))):
                    states[job_id] = state
                    if JobState(state).terminal:
                        self._ended_states[job_id] = state
        return states

    def pending_priorities(self) -> list[tuple[JobRec, Factors | None, str, bool]]:
        """Pending jobs in the order the last cycle ranked them, with their factors, reason
        and whether they are starving (read by API threads: works on copies)."""
        factors, hungry, now = dict(self.priorities), self.hungry, self.clock()
        jobs = list(self.pending.values())
        key, unscored = self.policy.queue_key(now, hungry), Factors(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
        assoc = {j.id: j.request.assoc for j in jobs}
        jobs.sort(key=lambda j: key(j.partition, j.submitted_at, j.id, factors.get(j.id, unscored), assoc[j.id]))
        return [(j, factors.get(j.id), self._reasons.get(j.id, "None"),
                 assoc[j.id] in hungry and factors.get(j.id, unscored).starving(now - j.submitted_at)) for j in jobs]

    def allocations(self) -> list[tuple[JobRec, ReplicaRec, Allocation]]:
        """What each replica holds now, with its job; a stopping replica keeps its resources
        until it has exited (read by API threads: works on copies)."""
        allocs = dict(self._allocs)
        return [(job, replica, allocs[replica.id]) for job in list(self.active.values())
                for replica in list(job.replicas) if replica.id in allocs]

    def _holdings(self) -> list[Holding]:
        out = []
        for job in self.active.values():
            for replica in job.replicas:
                alloc = self._allocs.get(replica.id)
                if alloc is not None and replica.state in (ReplicaState.RUNNING, ReplicaState.STARTING):
                    out.append(Holding(job.account or job.user, job.user, self.policy.qos_of(job.qos).name,
                                       len(alloc.gpus), alloc.cpus, alloc.memory))
        return out

    # -- preemption and requeue -------------------------------------------------------
    def _preempt(self, s: Session, preemption: Preemption, now: float) -> None:
        """Stop the victims (each replica gets its stop signal and grace period) and shrink
        elastic tasks; the preemptor starts once their resources are free."""
        for victim_id in preemption.victims:
            job = self.active.get(victim_id)
            if job is None or job.state not in (JobState.RUNNING, JobState.STARTING):
                continue
            mode = "cancel" if job.no_requeue else self.policy.preempt_mode(job.partition, job.qos)
            self._job_to(job, JobState.PREEMPTED, now, "preempted",
                         f"preempted by job {preemption.for_job}; it will be {'requeued' if mode == 'requeue' else 'cancelled'}")
            for replica in job.members:
                if not replica.state.terminal and replica.stop_requested_at is None:
                    self._stop_replica(job, replica, "preempted", now)
            self._dirty.add(job.id)
        for shrink in preemption.shrinks:
            job = self.active.get(shrink.job_id)
            if job is None or job.state not in (JobState.RUNNING, JobState.STARTING):
                continue
            task = job.task(shrink.task)
            self.journal.event(job.id, now, shrink.task, "shrunk",
                               message=f"{len(job.replicas_of(shrink.task))} -> {shrink.replicas} replicas to make room "
                                       f"for job {preemption.for_job} (elastic minimum {task.service.min_nodes})")
            self.journal.task(task.id, num_nodes=shrink.replicas)
            self._reconcile_scale(s, job, shrink.task, shrink.replicas, now)

    def _finish_preemption(self, job: JobRec, now: float) -> None:
        """Once every replica of a preempted job has stopped: requeue it (same id, same
        names, same checkpoint directory; CORRAL_RESTART_COUNT goes up) or cancel it."""
        if any(not r.state.terminal for r in job.members):
            return
        self.active.pop(job.id)
        self._publish.discard(job.id)
        mode = "requeue" if job.requeue_requested else self.policy.preempt_mode(job.partition, job.qos)
        if job.no_requeue and not job.requeue_requested:
            mode = "cancel"
        if mode != "requeue" or job.cancel_requested:
            why = "cancel requested while preempted" if job.cancel_requested else \
                "preempted (--no-requeue)" if job.no_requeue else "preempted (preempt mode cancel)"
            self._job_to(job, JobState.CANCELLED, now, "preempted", why, message=why)
            self._release_job(job)
            return
        self._release_job(job)
        job.requeues += 1
        for task in job.tasks:  # an elastic task comes back at its initial size: that one fit the pool
            initial = int(task.spec.get("num_nodes") or 1)
            if task.service.min_nodes is None or task.num_nodes <= initial:
                continue
            for replica in sorted(job.replicas_of(task.name), key=lambda r: r.rank)[initial:]:
                replica.stop_cause = "scale_down"  # ended already: now retired, out of the gang
                self.journal.replica(replica.id, stop_cause="scale_down")
            self.journal.event(job.id, now, task.name, "scaled",
                               message=f"{task.num_nodes} -> {initial} replicas for the requeue (its initial size)")
            task.num_nodes = initial
            self.journal.task(task.id, num_nodes=initial)
        for replica in job.members:
            if job.pipeline and replica.state == ReplicaState.SUCCEEDED:
                continue  # a pipeline resumes at the stage it was in; stages done stay done
            replica.restarts += 1
            replica.node, replica.gpus, replica.handle, replica.ready = None, (), None, False
            replica.stop_requested_at = replica.stop_cause = replica.kill_at = replica.exit_code = None
            self._replica_to(replica, ReplicaState.PENDING, "requeued", now, node=None, gpus=[], handle=None,
                             stop_requested_at=None, stop_cause=None, kill_at=None,
                             exit_code=None, ended_at=None, ready=False, restarts=replica.restarts)
        for task in job.tasks:
            task.termination_deadline = None
        job.started_at = None
        job.requeue_requested = False
        job.forget_request()
        held = {"user": Reason.HELD_USER.value, "admin": Reason.HELD_ADMIN.value}.get(job.hold)
        self._job_to(job, JobState.PENDING, now, "requeued", f"requeue {job.requeues}" + (", held" if held else ""),
                     requeues=job.requeues, started_at=None, reason=held or "None", requeue_requested_at=None)
        self._enqueue(job)
