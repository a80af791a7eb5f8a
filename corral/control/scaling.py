"""Elastic replica counts: a task grows with new (or revived) ranks that the scheduler
places like any job, so every limit holds at every instant, or shrinks by stopping its
highest ranks with the task's stop signal and grace period. A replica of a running job that
waits for a place (a task that grew, or a replica whose node went away) is a one-replica
request in the scheduler's plan, with its replica's id negated as its job id."""

from __future__ import annotations

from sqlalchemy.orm import Session

from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.placement import Placer
from corral.control.records import JobRec, ReplicaRec
from corral.control.transitions import Transitions
from corral.scheduler import Allocation, PendingJob, TaskRequest
from corral.states import JobState, ReplicaState
from corral.store import repository


class Scaling:
    def __init__(self, book: Book, moves: Transitions, carrier: Carrier, placer: Placer):
        self.book, self.moves, self.carrier, self.placer = book, moves, carrier, placer

    def reconcile(self, s: Session, job: JobRec, task_name: str, count: int, now: float) -> None:
        """Grow a task with new (or revived) ranks for the scheduler to place, or shrink it by
        stopping its highest ranks with the task's stop signal and grace period."""
        task = job.task(task_name)
        task.num_nodes = count
        members = sorted(job.replicas_of(task_name), key=lambda r: r.rank)
        if count > len(members):
            self.book.sched_needed = True  # the new ranks are placed by the scheduler
            retired = {r.rank: r for r in job.replicas if r.task == task_name and r.retired}
            ranks = list(range(len(members), count))
            fresh = [rank for rank in ranks if rank not in retired]
            position = job.tasks.index(task)
            for rank, replica_id in zip(fresh, repository.add_replicas(s, job.id, task_name, position, fresh)):
                job.replicas.append(ReplicaRec(replica_id, job.id, task_name, rank, ReplicaState.PENDING))
                self.moves.journal.event(job.id, now, f"{task_name}-{rank}", "scale_up", None,
                                         ReplicaState.PENDING.value)
            for rank in ranks:
                if rank in retired:
                    r = retired[rank]
                    r.stop_requested_at = r.stop_cause = r.exit_code = r.kill_at = r.handle = r.node = None
                    r.ready, r.gpus = False, ()
                    self.moves.replica_to(r, ReplicaState.PENDING, "scale_up", now, stop_requested_at=None,
                                          stop_cause=None, exit_code=None, kill_at=None, handle=None, node=None,
                                          gpus=[], ended_at=None, ready=False)
            job.replicas.sort(key=lambda r: ([t.name for t in job.tasks].index(r.task), r.rank))
        else:
            for replica in members[count:]:
                if replica.stop_requested_at is not None and not replica.state.terminal:
                    continue  # already on its way out
                if replica.state.terminal:  # already ended: just leaves the membership
                    replica.stop_cause = "scale_down"
                    self.moves.journal.replica(replica.id, stop_cause="scale_down")
                else:
                    self.carrier.stop(job, replica, "scale_down", now)
        self.moves.event(job.id, now, task_name, "scaled", f"{len(members)} -> {count} replicas")
        self.book.touch(job.id)

    def requests(self, now: float) -> list[PendingJob]:
        """Replicas of running jobs waiting for a place, each as a one-replica request the
        scheduler ranks and places like any job, so QOS and account limits, partitions and
        priorities hold at every instant."""
        out = []
        for job in self.book.active.values():
            if job.state not in (JobState.RUNNING, JobState.STARTING) or job.cancel_requested:
                continue
            now_placed = {t.name for t in job.stage()}  # a pipeline's later stages wait their turn
            for r in job.replicas:
                if r.state != ReplicaState.PENDING or r.task not in now_placed:
                    continue
                task = job.task(r.task)
                limit = job.time_limit_of(task)
                if limit is not None and job.started_at is not None:
                    limit = max(1.0, limit - (now - job.started_at))
                ports = tuple(sorted(set(task.service.ports.values())))
                out.append(PendingJob(-r.id, (TaskRequest(task.name, 1, task.gpus, task.cpus, task.memory,
                                                          task.gpu_type, ports=ports),),
                                      job.submitted_at, job.user, job.account, limit, job.nice, job.partition,
                                      job.qos, job.priority, (), job.name, owner=job.id))
        return out

    def place(self, replica_id: int, alloc: Allocation, now: float) -> None:
        for job in self.book.active.values():
            replica = next((r for r in job.replicas if r.id == replica_id), None)
            if replica is not None and replica.state == ReplicaState.PENDING:
                self.placer.place(job, replica, Allocation(replica.task, replica.rank, alloc.node, alloc.gpus,
                                                           alloc.cpus, alloc.memory, alloc.ports), now)
                self.book.launch_check.add(job.id)
                return
