"""Rebuilding the loop's memory from the store: at start-up, and after a cycle whose writes
were lost (the database went away mid-commit; the memory that cycle changed is not to be
trusted). Every job the store holds as STARTING, RUNNING or PREEMPTED is loaded; each
executor adopts the attempts the store knows of (alive ones are watched again, ones that
ended report their exits, ones that never started are launched anew under a new key; ones on
a node the site's configuration dropped are killed once adopted and reported lost); kill
and restart deadlines are re-armed; scale requests not yet carried out are reconciled.
Pending jobs are read back by the queue's next scan."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.control.accounting import Ledger
from corral.control.book import Book
from corral.control.inventory import Inventory
from corral.control.observations import Observations
from corral.control.records import load_records
from corral.control.scaling import Scaling
from corral.executors.contract import DeclaredNodes, Handle
from corral.states import JobState, ReplicaState
from corral.store.tables import Job

_LIVE = (ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.RESTARTING)


class Recovery:
    def __init__(self, book: Book, inventory: Inventory, ledger: Ledger, scaling: Scaling,
                 observations: Observations):
        self.book, self.inventory, self.ledger = book, inventory, ledger
        self.scaling, self.observations = scaling, observations

    def recover(self, s: Session, now: float, commit: Callable[[Session], None], why: str = "a server restart") -> None:
        """Load every active job and have each executor adopt its attempts (reported
        through the executors' event streams before this returns)."""
        book = self.book
        self.observations.recovering = why
        ids = list(s.scalars(select(Job.id).where(Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value,
                                                                  JobState.PREEMPTED.value]))))
        book.active = load_records(s, ids)
        self.ledger.load(s, now)
        adopt: dict[str, list[tuple[str, Handle | None]]] = {}
        for job in book.active.values():
            book.touch(job.id)
            book.launch_check.add(job.id)
            for replica in job.replicas:
                if replica.state not in _LIVE or replica.node is None:
                    continue
                book.allocs[replica.id] = replica.allocation()
                if replica.state == ReplicaState.RESTARTING:
                    book.wake_at(replica.restart_at or now, job.id)
                    continue
                infra = replica.infra or self.inventory.infra_of_node(replica.node)
                replica.infra = infra
                book.by_key[replica.launch_key] = (job.id, replica.id)
                executor = self.inventory.executors.get(infra)
                if isinstance(executor, DeclaredNodes) and not executor.declares(replica.node):
                    # adopted to be ended (never alive beside its replacement), then lost
                    book.departed[replica.launch_key] = f"node {replica.node} is no longer in the site's configuration"
                adopt.setdefault(infra, []).append((replica.launch_key, replica.handle))
        for job in book.active.values():  # scale requests that were not carried out yet
            for task in job.tasks:
                if task.num_nodes != len(job.replicas_of(task.name)):
                    self.scaling.reconcile(s, job, task.name, task.num_nodes, now)
        commit(s)
        for infra, attempts in adopt.items():
            executor = self.inventory.executors.get(infra)
            if executor is None:  # the site no longer has this infra: its attempts are lost
                executor = self.inventory.gone(infra)
            executor.adopt(attempts)  # reported before it returns: the next cycle sees all of it
