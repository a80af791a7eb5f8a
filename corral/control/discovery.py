"""The discovery files every replica reads (``CORRAL_HOSTS_FILE`` for its names,
``CORRAL_PEERS_FILE`` for every replica's address, ports, state and readiness), made current
on the nodes the job runs on by each executor there, and on the server (the API reads it).
Written after the cycle's commit, for the jobs marked stale (``Book.publish``)."""

from __future__ import annotations

import json

from corral.control.book import Book
from corral.control.endpoints import Endpoints
from corral.control.inventory import Inventory
from corral.control.records import JobRec, ReplicaRec
from corral.executors.registry import DEFAULT
from corral.runtime.discovery import hosts_text, peers_document
from corral.states import ReplicaState


class Discovery:
    def __init__(self, book: Book, inventory: Inventory, endpoints: Endpoints):
        self.book, self.inventory, self.endpoints = book, inventory, endpoints

    def publish_job(self, job: JobRec, now: float, launching: frozenset[int] = frozenset()) -> None:
        """Write the job's discovery files. Replicas in ``launching`` are about to start and
        are written as RUNNING already, so one write before the launch serves both the new
        processes and their peers (a launch that fails marks the job for another write)."""
        def state(r: ReplicaRec) -> tuple[str, bool]:
            if r.id in launching:
                return ReplicaState.RUNNING.value, job.task(r.task).service.readiness_of(r.rank) is None
            # ready only while it runs: a member waiting to be placed again is never ready
            return r.state.value, r.ready and r.state == ReplicaState.RUNNING

        tasks = [{"name": t.name, "ports": t.service.ports,
                  "replicas": [{"rank": r.rank, "addr": r.addr, "state": state(r)[0], "ready": state(r)[1],
                                "restarts": r.restarts, "ports": r.ports or t.service.ports, "node": r.node,
                                "gang": t.service.gang_of(r.rank) if t.service.gang_size > 1 else None}
                               for r in job.replicas_of(t.name)]} for t in job.tasks]
        peers = peers_document(job.id, job.name, tasks, now, job.names_domain)
        hosts = hosts_text(peers, node_names=any(t.service.sbatch is not None for t in job.tasks))
        text = json.dumps(peers, indent=1)
        by_infra: dict[str, set[str]] = {}
        for r in job.replicas:
            if r.node is not None and not r.state.terminal:
                by_infra.setdefault(r.infra or self.inventory.infra_of_node(r.node), set()).add(r.node)
        by_infra.setdefault(DEFAULT, set())  # the server's copy, kept by the default infra
        for infra, nodes in by_infra.items():
            executor = self.inventory.executors.get(infra)
            if executor is not None:
                executor.publish(job.id, nodes, hosts, text)
        self.book.publish.discard(job.id)
        if any(t.service.endpoint is not None for t in job.tasks):
            self.endpoints.track(job.id)

    def publish_marked(self, now: float) -> None:
        marked, self.book.publish = self.book.publish, set()
        for job_id in sorted(marked):
            job = self.book.active.get(job_id)  # an ended job has nobody left to read its files
            if job is not None:
                self.publish_job(job, now)
