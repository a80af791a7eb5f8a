"""Jobs that an engine must provision before corral can place them: a job in an ``infra:
slurm`` partition becomes one Slurm job, and waits in Slurm's queue (with Slurm's own
reason shown as its pending reason) until Slurm starts the allocation; only then do its
nodes join the pool, dedicated to it, and the scheduler places it there.

While it runs, its allocation is watched: Slurm requeueing it (preemption, node failure)
requeues the corral job under the same id, names and checkpoint directory, keeping the same
Slurm job; Slurm ending it (time limit, cancelled outside corral, node failure without
requeue) ends the corral job. An allocation whose corral job is over is cancelled."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from corral.executors.slurm.cli import SlurmError, SlurmRefused
from corral.executors.slurm.shape import Replica
from corral.scheduler.plan import Reason
from corral.states import JobState, ReplicaState

log = logging.getLogger("corral.control")

# squeue states in which an allocation that ran before is waiting to run again
REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
LIVE = ("RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED")


# corral's own reasons that leave a job free to be given an allocation: it waits only for nodes
# (its partition has none until Slurm starts its allocation). Gates (dependencies, array
# throttles, QOS and account limits, holds) keep it out of Slurm's queue too.
FOR_NODES = frozenset({Reason.RESOURCES.value, Reason.PRIORITY.value, Reason.GPU_TYPE.value, Reason.TOPOLOGY.value,
                       Reason.CONSTRAINT.value, Reason.PREEMPTING.value})


class ProvisioningMixin:
    def _provision(self, s: Session, now: float) -> None:
        """Step 5a, after the scheduler said why each job waits: a job of an ``infra: slurm``
        partition that waits only for nodes gets its Slurm allocation (submitted once); while
        Slurm keeps it pending, Slurm's reason is the job's. Running jobs' allocations are
        followed (requeued by Slurm, or ended), and those of ended jobs cancelled."""
        partitions = self.site.slurm_partitions
        engine = self.executors.get("slurm")
        if not partitions or engine is None:
            return
        forward = set(self.site.slurm.forward) if self.site.slurm is not None else set()
        waiting: set[int] = set()
        keep: set[int] = set()
        # an array's %N throttle counts the elements that hold an allocation, pending ones too
        holding: dict[int, int] = {}
        for job in list(self.pending.values()) + list(self.active.values()):
            if job.array_job_id and (job.id in self.active or engine.slurm_id(job.id) is not None):
                holding[job.array_job_id] = holding.get(job.array_job_id, 0) + 1
        for job in list(self.pending.values()):
            if job.partition not in partitions:
                continue
            keep.add(job.id)
            submitted = engine.slurm_id(job.id) is not None
            if not submitted and self._reasons.get(job.id) not in FOR_NODES:
                continue  # not placed yet by the scheduler, or gated: not Slurm's business yet
            if not submitted and job.array_job_id and job.array_throttle and \
                    holding.get(job.array_job_id, 0) >= job.array_throttle:
                self._set_reason(job.id, Reason.ARRAY_LIMIT.value)
                continue
            stage = job.stage()
            replicas = [Replica(t.gpus, t.cpus, t.memory, t.service.distinct_nodes)
                        for t in stage for _ in range(t.num_nodes)]
            constraint = next((t.service.constraint for t in stage if t.service.constraint), None)
            gpu_type = next((t.gpu_type for t in stage if t.gpu_type), None)
            try:
                reason = engine.provision(job.id, replicas, gpu_type, job.time_limit,
                                          max((t.grace_period for t in stage), default=10.0),
                                          partitions[job.partition] or None,
                                          job.account if "account" in forward else None,
                                          job.qos if "qos" in forward else None,
                                          any(t.service.exclusive for t in stage), constraint)
            except (SlurmRefused, ValueError) as exc:
                self._refused_by_engine(job, f"Slurm refused the job: {exc}", now)
                keep.discard(job.id)
                continue
            except SlurmError as exc:  # the controller does not answer: the job waits, and says why
                reason = f"Slurm unreachable: {str(exc)[:120]}"
            if not submitted and engine.slurm_id(job.id) is not None:
                if job.array_job_id:
                    holding[job.array_job_id] = holding.get(job.array_job_id, 0) + 1
                self.journal.event(job.id, now, "job", "slurm",
                                   message=f"submitted to Slurm as job {engine.slurm_id(job.id)}")
            if reason is None:
                self._sched_needed = True  # its nodes are in the pool: place it
            else:
                waiting.add(job.id)
                self._set_reason(job.id, reason)
        for job in list(self.active.values()):
            if job.partition not in partitions:
                continue
            keep.add(job.id)
            if job.state == JobState.PREEMPTED or job.cancel_requested or job.requeue_requested:
                continue
            info = engine.allocation(job.id)
            state = info.state if info is not None else "GONE"
            if state in LIVE:
                continue
            if state in REQUEUED:
                engine.keep_on_release(job.id)
                self.journal.event(job.id, now, "job", "slurm", message=f"Slurm requeued its allocation "
                                                                     f"(job {engine.slurm_id(job.id)}): requeueing")
                self._collect_requeues(s, [job.id], now)
            else:
                why = f"Slurm ended its allocation ({state.lower()})"
                self.journal.event(job.id, now, "job", "slurm", message=why)
                job.cancel_requested = True
                self._dirty.add(job.id)
        engine.prune(keep)
        self._engine_waiting = waiting

    def _set_reason(self, job_id: int, reason: str) -> None:
        if self._reasons.get(job_id) != reason:
            self._reasons[job_id] = reason
            self.journal.job(job_id, reason=reason)

    def _refused_by_engine(self, job, why: str, now: float) -> None:  # noqa: ANN001 - a JobRec
        self.pending.pop(job.id, None)
        self._reasons.pop(job.id, None)
        self._job_to(job, JobState.FAILED, now, "slurm", why, message=why)
        for replica in job.replicas:
            self._replica_to(replica, ReplicaState.KILLED, "slurm", now, ended_at=now)
