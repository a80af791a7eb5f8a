"""Binding what the scheduler placed: a claimed job's replicas (or one replica of a running
job that grows or is replaced) get their node, GPUs, CPUs and memory, the address and ports
the node's executor gives them, and a new attempt key; STARTING and the key are journalled,
and nothing launches before that is committed. A job's rank 0 of each task gets its
rendezvous port (``MASTER_PORT``), and a task with resource alternatives records the one it
starts with.

A node whose engine does not answer while its replica is bound (a Ray worker that died and
is not yet declared dead) does not fail the cycle, which would lose every other job's
placement with it: the replica is bound as declared and noted ``unanswered``, and the
launcher reports its attempt lost with that node instead of starting it.

A declared port is the port the replica listens on: the scheduler placed it where that port is
free on the node's address, and the executor binds it. Where an executor still had to give
another, the replica's event names the declared and bound ports and why."""

from __future__ import annotations

from dataclasses import replace

from corral.control.book import Book
from corral.control.inventory import Inventory
from corral.control.records import JobRec, ReplicaRec, alternatives_of
from corral.control.transitions import Transitions
from corral.executors.contract import Binding, LaunchError, Preparing
from corral.scheduler import Allocation
from corral.states import JobState, ReplicaState


class Placer:
    def __init__(self, book: Book, moves: Transitions, inventory: Inventory):
        self.book, self.moves, self.inventory = book, moves, inventory

    def admit(self, job: JobRec, allocations: tuple[Allocation, ...], now: float, choice: tuple[int, ...] = ()) -> None:
        """A job the scheduler placed and the loop claimed (PENDING → STARTING in the store)."""
        job.state = JobState.STARTING
        job.yields_to = 0
        self.book.active[job.id] = job
        chosen = self._choose(job, choice)
        self.moves.journal.event(job.id, now, "job", "scheduled", JobState.PENDING.value, JobState.STARTING.value,
                                 f"placed {len(allocations)} replica(s) on "
                                 f"{', '.join(sorted({a.node for a in allocations}))}"
                                 + (f" with {chosen}" if chosen else ""))
        by_slot = {(a.task, a.rank): a for a in allocations}
        silent: dict[str, str] = {}  # node -> what its engine said when it did not answer
        for task in job.stage():
            first = by_slot.get((task.name, 0)) or allocations[0]
            try:
                task.master_port = self.inventory.for_node(first.node).rendezvous_port(first.node)
            except LaunchError as exc:
                silent[first.node] = str(exc)
                continue  # the job does not start with this placement (its rank 0 is lost)
            self.moves.journal.task(task.id, master_port=task.master_port)
        for replica in job.members:  # not replicas retired by a scale-down (or a requeue at initial size)
            if job.pipeline and (replica.task, replica.rank) not in by_slot:
                continue  # a stage still to come (or one done)
            self.place(job, replica, by_slot[(replica.task, replica.rank)], now, silent)
        self.book.launch_check.add(job.id)

    def _choose(self, job: JobRec, choice: tuple[int, ...]) -> str:
        """Record the resource alternative each task starts with (what status shows and what a
        restart or growth of it asks for); a description of the choices, "" when none."""
        said = []
        for task, index in zip(job.tasks, choice):
            options = alternatives_of(task.service)
            if not options:
                continue
            task.gpus, task.cpus, task.memory, task.gpu_type = options[index]
            self.moves.journal.task(task.id, gpus=task.gpus, cpus=task.cpus, memory=task.memory,
                                    gpu_type=task.gpu_type)
            what = f"{task.gpu_type}:{task.gpus}" if task.gpu_type else f"{task.gpus} GPU(s)"
            said.append(f"{task.name} on {what} (alternative {index + 1} of {len(options)})")
        return "; ".join(said)

    def place(self, job: JobRec, replica: ReplicaRec, alloc: Allocation, now: float,
              silent: dict[str, str] | None = None) -> None:
        """Bind a replica to its allocation: the executor of the node gives its address and
        ports; a new attempt key is journalled with STARTING, before anything launches. A node
        in ``silent`` (or whose executor does not answer now) leaves the replica unanswered."""
        infra = self.inventory.infra_of_node(alloc.node)
        executor = self.inventory.executors[infra]
        previous = None
        if replica.addr and replica.node == alloc.node and replica.ports is not None:
            previous = Binding(replica.addr, dict(replica.ports))
        declared = job.task(replica.task).service.ports
        silent = {} if silent is None else silent
        binding = None
        if alloc.node not in silent:
            try:
                binding = executor.bind(job.id, replica.id, alloc.node, declared, previous)
            except LaunchError as exc:
                silent[alloc.node] = str(exc)
        if binding is None:  # never launched: what it would have listened on, for the record
            binding = previous or Binding(replica.addr or "", dict(declared))
            self.book.unanswered[replica.id] = f"node {alloc.node} did not answer: {silent[alloc.node]}"
        replica.node, replica.gpus, replica.cpus, replica.memory = alloc.node, alloc.gpus, alloc.cpus, alloc.memory
        replica.addr, replica.ports, replica.infra = binding.addr, dict(binding.ports), infra
        moved = {name: (port, binding.ports.get(name)) for name, port in declared.items()
                 if binding.ports.get(name) != port}
        if moved and (previous is None or previous.ports != binding.ports):  # said once, not at every restart
            said = ", ".join(f"{name} {want} → {got}" for name, (want, got) in moved.items())
            self.moves.event(job.id, now, replica.label, "port-moved",
                             f"declared port(s) not honoured on {alloc.node}: {said}"
                             + (f" ({binding.moved})" if binding.moved else ""))
        if alloc.ports:  # what it holds on the node's address is what was bound
            alloc = replace(alloc, ports=tuple(sorted(set(binding.ports.values()))))
        replica.attempt += 1
        replica.handle = None
        if isinstance(executor, Preparing):  # e.g. its cgroup made while the placement commits
            executor.prepare(replica.launch_key)
        self.book.allocs[replica.id] = alloc
        self.moves.replica_to(replica, ReplicaState.STARTING, "scheduled", now, node=alloc.node,
                              gpus=list(alloc.gpus), cpus=alloc.cpus, memory=alloc.memory, addr=replica.addr,
                              ports=replica.ports, infra=infra, attempt=replica.attempt, handle=None)
