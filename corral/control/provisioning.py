"""Jobs that an engine must provision nodes for before corral can place them (a partition
whose infra is a ``Provisioner``: each job of an ``infra: slurm`` partition becomes one
Slurm job). Such a job waits in the engine's queue (with the engine's reason shown as its
pending reason) until the engine gives its nodes; only then do they join the pool,
dedicated to it, and the scheduler places it there.

While it runs, its nodes are followed: the engine requeueing them (preemption, node
failure) requeues the corral job under the same id, names and checkpoint directory, waiting
for the same nodes again; the engine ending them (time limit, cancelled outside corral)
ends the corral job. What is held for a job that is over is given back, and so is what a job
corral requeues held: it waits for new nodes (``scheduling`` never places it on nodes whose
release is queued)."""

from __future__ import annotations

import logging

from collections.abc import Callable

from sqlalchemy.orm import Session

from corral.auth.accounts import account_to_start
from corral.control.book import Book
from corral.control.inventory import Inventory
from corral.control.requeue import Requeues
from corral.control.transitions import Transitions
from corral.executors.contract import (Allocation, Provision, Provisioned, Provisioner, ProvisionRequest,
                                      ReplicaShape)
from corral.scheduler.plan import Reason
from corral.states import JobState

log = logging.getLogger("corral.control")

# corral's own reasons that leave a job free to be given nodes: it waits only for nodes (its
# partition has none until the engine provisions them). Gates (dependencies, array
# throttles, QOS and account limits, holds) keep it out of the engine's queue too.
# how a job ends when the engine ended its nodes
_ENDS = {Allocation.TIMEOUT: JobState.TIMEOUT, Allocation.CANCELLED: JobState.CANCELLED,
         Allocation.ENDED: JobState.FAILED}

FOR_NODES = frozenset({Reason.RESOURCES.value, Reason.PRIORITY.value, Reason.GPU_TYPE.value, Reason.TOPOLOGY.value,
                       Reason.CONSTRAINT.value, Reason.PREEMPTING.value})


def request_of(job, target: str | None) -> ProvisionRequest:  # noqa: ANN001 - a JobRec
    """What a pending job asks of the engine for the stage it is placed for now."""
    stage = job.stage()
    # replicas of a task declaring ports each need a node of their own: two cannot listen on
    # one port of one node's address
    replicas = tuple(ReplicaShape(t.gpus, t.cpus, t.memory, t.service.distinct_nodes or bool(t.service.ports),
                                  t.gpu_type if t.gpus else None, tuple(t.service.ports.values()))
                     for t in stage for _ in range(t.num_nodes))
    return ProvisionRequest(job.id, replicas, next((t.gpu_type for t in stage if t.gpu_type), None), job.time_limit,
                            max((t.grace_period for t in stage), default=10.0), target, job.account, job.qos,
                            any(t.service.exclusive for t in stage),
                            next((t.service.constraint for t in stage if t.service.constraint), None),
                            account_to_start(job.run_as))


class Provisioning:
    def __init__(self, book: Book, moves: Transitions, inventory: Inventory, requeues: Requeues,
                 provisioned: dict[str, tuple[str, str]], set_reason: Callable[[int, str], None]):
        self.book, self.moves, self.requeues, self.inventory = book, moves, requeues, inventory
        self.set_reason = set_reason
        # partition -> (its provisioning engine, the engine's own partition or pool)
        self.partitions: dict[str, tuple[Provisioner, str]] = {}
        for partition, (infra, target) in provisioned.items():
            engine = inventory.executors.get(infra)
            if isinstance(engine, Provisioner):
                self.partitions[partition] = (engine, target)

    def follow(self, s: Session, now: float) -> None:
        """Before the executors' events are applied: what became of running jobs' nodes.
        Requeued by the engine → the job is requeued (and waits for the same nodes); ended →
        the job ends as the engine ended them, so a replica lost with them is not taken for
        a lost node to recover from."""
        down = self.inventory.down_partitions
        for job in list(self.book.active.values()):
            found = self.partitions.get(job.partition)
            if found is None or job.ended_by is not None or job.partition in down:
                continue  # (an engine that does not answer cannot say what became of them: asked once it does)
            if job.state == JobState.PREEMPTED or job.cancel_requested or job.requeue_requested:
                continue
            fate, words = found[0].allocation(job.id)
            if fate == Allocation.LIVE:
                continue
            self.moves.event(job.id, now, "job", "provisioned", words)
            if fate == Allocation.REQUEUED:
                self.requeues.requested(s, [job.id], now)
            else:
                job.ended_by = (_ENDS[fate], words)
                self.book.dirty.add(job.id)

    def run(self, s: Session, now: float) -> None:
        """Step 5a, after the scheduler said why each job waits: a job of a provisioned
        partition that waits only for nodes gets them asked for (once); while the engine keeps
        it waiting, the engine's reason is the job's. What is held for ended jobs is given
        back."""
        partitions, book = self.partitions, self.book
        if not partitions:
            return
        waiting: set[int] = set()
        keep: dict[int, set[int]] = {}  # engine -> its jobs still wanting nodes
        # an array's %N throttle counts the elements that hold nodes, pending ones too
        holding: dict[int, int] = {}
        for job in list(book.pending.values()) + list(book.active.values()):
            if job.array_job_id and job.partition in partitions and (
                    job.id in book.active or partitions[job.partition][0].holds(job.id)):
                holding[job.array_job_id] = holding.get(job.array_job_id, 0) + 1
        down = self.inventory.down_partitions
        for job in list(book.pending.values()):
            if job.partition not in partitions:
                continue
            engine, target = partitions[job.partition]
            keep.setdefault(id(engine), set()).add(job.id)
            if job.partition in down:  # its engine does not answer: nothing is asked of it until it does
                waiting.add(job.id)
                self.set_reason(job.id, Reason.PARTITION_DOWN.value)
                continue
            asked = engine.holds(job.id)
            if not asked and book.reasons.get(job.id) not in FOR_NODES:
                continue  # not placed yet by the scheduler, or gated: not the engine's business yet
            if not asked and job.array_job_id and job.array_throttle and \
                    holding.get(job.array_job_id, 0) >= job.array_throttle:
                self.set_reason(job.id, Reason.ARRAY_LIMIT.value)
                continue
            try:
                result = engine.provision(request_of(job, target or None))
            except LookupError as exc:  # its Unix account is gone: no engine could start it as it
                result = Provisioned(Provision.REFUSED, str(exc))
            if result.state == Provision.REFUSED:
                book.pending.pop(job.id, None)
                book.reasons.pop(job.id, None)
                self.moves.kill_all(job, JobState.FAILED, now, "provisioning", result.reason, message=result.reason)
                keep[id(engine)].discard(job.id)
                continue
            if result.submitted is not None:
                if job.array_job_id:
                    holding[job.array_job_id] = holding.get(job.array_job_id, 0) + 1
                self.moves.event(job.id, now, "job", "provisioned", f"asked for as {result.submitted}")
            if result.state == Provision.READY:
                book.sched_needed = True  # its nodes are in the pool: place it
            else:
                waiting.add(job.id)
                self.set_reason(job.id, result.reason)
        for job in list(book.active.values()):
            if job.partition in partitions:
                keep.setdefault(id(partitions[job.partition][0]), set()).add(job.id)
        unreachable = {p for p in partitions if p in down}
        # a job that ended this cycle is released after the commit, told how it ended (its
        # engine's accounting records that); not pruned before, as if it had vanished
        releasing = self.requeues.carrier.effects.releasing()
        for engine in {id(e): e for p, (e, _) in partitions.items() if p not in unreachable}.values():
            engine.prune(keep.get(id(engine), set()) | releasing)  # (one that does not answer is pruned once it does)
        book.engine_waiting = waiting

    def misfit(self, partition: str, tasks) -> str | None:  # noqa: ANN001 - spec TaskSpecs
        """At submission (API threads): why a job of a provisioned partition could never get
        nodes there, or None. Bounded to 2 s: an engine slow to answer decides later."""
        found = self.partitions.get(partition)
        if found is None or partition in self.inventory.down_partitions:
            return None  # (an engine that does not answer cannot tell: the job waits for it)
        engine, target = found
        replicas = [ReplicaShape(t.resources.gpus, t.resources.cpus, t.resources.memory, bool(t.ports),
                                 t.resources.gpu_type if t.resources.gpus else None, tuple(t.ports.values()))
                    for t in tasks for _ in range(t.num_nodes)]
        return engine.misfit(target or None, replicas, 2.0)
