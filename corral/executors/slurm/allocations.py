"""The Slurm allocations a server runs replicas in, and how corral obtains them: the
``Provisioner`` side of the Slurm infra.

* **The server's own** — ``corral server start`` inside ``salloc``/``sbatch``: its nodes,
  named by their hostnames, are shared by every corral job under corral's queue.
* **One per corral job** — a job in a partition with ``infra: slurm`` is submitted as one
  Slurm job sized to its gang (``shape``), named after the job (so a crash never submits it
  twice: it is found again by name), and waits in Slurm's queue with Slurm's reason. Once
  it runs, its nodes join the pool as ``s{slurm id}-{host}``, dedicated to that job. Slurm
  requeueing it requeues the corral job, which waits for the same Slurm job; Slurm ending it
  ends the corral job; a corral job's end completes it (SIGUSR1 to its hold script), and so
  does corral requeueing it: the job asks for a new one, never taking back the one it gave
  back while that still ends under its name."""

from __future__ import annotations

import getpass
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.executors.contract import (Allocation as Fate, LaunchError, Provision, Provisioned, ProvisionRequest,
                                      ReplicaShape)
from corral.executors.slurm import shape as slurmjob
from corral.executors.slurm.cli import JobInfo, SlurmCli, SlurmError, SlurmRefused
from corral.pool import NodeSpec
from corral.runtime.discovery import port_domain

log = logging.getLogger("corral.srun")

# squeue states in which an allocation that ran before waits to run again
REQUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
LIVE_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED")
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "SPECIAL_EXIT")
# corral's end states as Slurm's accounting should record its allocation's end
CANCELLED_STATES = ("CANCELLED",)
FAILED_STATES = ("FAILED", "TIMEOUT", "PREEMPTED")
HOLDER_TRIES, HOLDER_RETRY_S = 5, 2.0  # the hold script signalled up to 5 times, 2 s apart, then cancelled
SHAPE_TTL_S = 60.0  # how long a Slurm partition's node shape is trusted at submission
RELEASED_TTL_S = 600.0  # how long a given-back allocation is remembered (its end takes seconds)


@dataclass
class SlurmAllocation:
    slurm_id: str
    job_id: int | None  # the corral job it was made for; None: the server's own allocation
    info: JobInfo | None = None
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # corral node -> (host, address)
    checked: bool = False  # Slurm answered about it since it was tracked
    specs: list[NodeSpec] = field(default_factory=list)
    owner: tuple[int, int] | None = None  # (uid, gid) of the Slurm job's user, once known

    @property
    def running(self) -> bool:
        return self.info is not None and self.info.state == "RUNNING"


class Allocations:
    """Every allocation this server knows, kept current by ``refresh`` (the executor's
    watcher calls it); ``changed`` is called when the nodes they hold change."""

    def __init__(self, cli: SlurmCli, scope: str, logs_dir, changed: Callable[[], None],
                 own_allocation: str | None = None, forward: tuple[str, ...] = ()):
        self.cli, self.scope, self.logs_dir = cli, scope, logs_dir
        self._changed = changed
        self.forward = frozenset(forward)
        self.lock = threading.RLock()
        self.by_id: dict[str, SlurmAllocation] = {}
        self._by_job: dict[int, str] = {}  # corral job -> its allocation
        self._node_alloc: dict[str, str] = {}  # corral node -> allocation
        self._kinds: dict[str, slurmjob.NodeKind] = {}  # Slurm partition -> its node shape
        self._shapes: dict[str, tuple[float, slurmjob.NodeKind]] = {}  # the same, for submission checks
        self._kept: set[int] = set()  # jobs whose requeued allocation outlives their release
        self._ends: dict[int, str] = {}  # job -> how it ended, until its allocation is released
        self._released: dict[str, float] = {}  # Slurm job given back -> when (monotonic), while it ends
        self.version = 0
        self.own = own_allocation

    def connect(self) -> None:
        """Once Slurm answers (never before: a server that started blind would take its jobs'
        allocations for gone): the server's own allocation, and those an earlier server
        submitted for its jobs. Raises ``SlurmError`` while Slurm cannot tell."""
        own = self.own
        if own:
            with self.lock:
                self.by_id.setdefault(own, SlurmAllocation(own, None))
            self.refresh()
            with self.lock:
                alloc = self.by_id[own]
            if not alloc.checked:
                raise SlurmError(f"Slurm did not say whether job {own} (this allocation) runs")
            if not alloc.running:
                raise SlurmError(f"Slurm job {own} (this allocation) is not running")
        self._find_existing()
        self.refresh()  # what Slurm says of each, before the loop asks what became of them

    # -- the pool ------------------------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        with self.lock:
            return [spec for alloc in self.by_id.values() if alloc.running for spec in alloc.specs]

    def where(self, node: str) -> tuple[SlurmAllocation, str, str]:
        """The running allocation holding ``node``, its Slurm host name and address."""
        with self.lock:
            slurm_id = self._node_alloc.get(node)
            alloc = self.by_id.get(slurm_id) if slurm_id else None
            if alloc is None or node not in alloc.nodes:
                raise LaunchError(f"node {node} is not in a running Slurm allocation")
            host, addr = alloc.nodes[node]
            return alloc, host, addr

    def track(self, slurm_id: str, job_id: int) -> None:
        """Watch an allocation made for a corral job (submitted here, or found again after a
        server restart); its nodes join the pool once Slurm starts it."""
        with self.lock:
            if slurm_id not in self.by_id:
                self.by_id[slurm_id] = SlurmAllocation(slurm_id, job_id)
                self._by_job[job_id] = slurm_id

    def _find_existing(self) -> None:
        """Allocations an earlier server submitted for its jobs (by their Slurm job name)."""
        try:
            # a root server's allocations belong to its jobs' users: found by name among everyone's
            users = () if os.geteuid() == 0 else ("-u", getpass.getuser())
            out = self.cli.run("squeue", "-h", "-o", "%i %j", *users)
        except SlurmError as exc:
            raise SlurmError(f"Slurm does not answer, so this server cannot tell which of its jobs "
                             f"have allocations: {exc}") from exc
        for line in out.splitlines():
            parts = line.split(None, 1)
            job_id = slurmjob.job_of(parts[1].strip(), self.scope) if len(parts) == 2 else None
            if job_id is not None:
                self.track(parts[0], job_id)

    def refresh(self) -> None:
        """Read Slurm's state of every allocation; nodes join (started) or leave (ended)."""
        with self.lock:
            ids = list(self.by_id)
        if not ids:
            return
        try:
            infos = self.cli.jobs(ids)
        except SlurmError as exc:
            log.warning("could not read Slurm's queue: %s", exc)
            return
        changed = False
        for slurm_id in ids:
            info = infos.get(slurm_id)
            with self.lock:
                alloc = self.by_id.get(slurm_id)
                if alloc is None:
                    continue
                was = alloc.running
                alloc.info = info
                alloc.checked = True
                if alloc.running and not was:
                    self._adopt_nodes(alloc)
                    changed = True
                elif was and not alloc.running:
                    for node in alloc.nodes:
                        self._node_alloc.pop(node, None)
                    alloc.nodes, alloc.specs = {}, []
                    changed = True
        if changed:
            with self.lock:
                self.version += 1
            self._changed()

    def _adopt_nodes(self, alloc: SlurmAllocation) -> None:
        shares = alloc.info.nodes
        try:
            facts = self.cli.node_facts([s.host for s in shares])
        except SlurmError:
            facts = {}
        nodes, specs = {}, []
        for share in shares:
            name = share.host if alloc.job_id is None else f"s{alloc.slurm_id}-{share.host}"
            addr, features = facts.get(share.host, (share.host, ()))
            try:
                spec = NodeSpec(name=name, gpus=share.gpus, gpu_type=share.gpu_type, cpus=float(share.cpus),
                                memory=round(share.memory_mb / 1024, 3), labels={f: "true" for f in features},
                                dedicated_to=alloc.job_id, address=port_domain(addr))
            except ValueError:
                log.warning("Slurm node %s has a name corral cannot use; left out", share.host)
                continue
            nodes[name] = (share.host, addr)
            specs.append(spec)
            self._node_alloc[name] = alloc.slurm_id
        alloc.nodes, alloc.specs = nodes, specs

    # -- provisioning (the executor's Provisioner methods) ---------------------------------------
    def provision(self, request: ProvisionRequest) -> Provisioned:
        """Make sure the job has its Slurm allocation: submitted once (never twice: an
        allocation is found again by name), READY once it runs and its nodes are in the pool,
        else Slurm's reason it waits."""
        try:
            return self._provision(request)
        except (SlurmRefused, ValueError) as exc:
            return Provisioned(Provision.REFUSED, f"Slurm refused the job: {exc}")
        except SlurmError as exc:
            return Provisioned(Provision.UNREACHABLE, f"Slurm unreachable: {str(exc)[:120]}")

    def _provision(self, request: ProvisionRequest) -> Provisioned:
        job_id = request.job_id
        with self.lock:
            slurm_id = self._by_job.get(job_id)
            alloc = self.by_id.get(slurm_id) if slurm_id else None
        if alloc is not None and alloc.checked and alloc.info is None:
            # cancelled outside corral (or forgotten) while the job still waits: ask again
            log.info("job %s: its Slurm job %s is gone; asking Slurm again", job_id, slurm_id)
            with self.lock:
                self.by_id.pop(slurm_id, None)
                self._by_job.pop(job_id, None)
            alloc = None
        submitted = None
        if alloc is None:
            for existing in self.cli.by_name(slurmjob.job_name(self.scope, job_id)):
                if existing in self._released:
                    continue  # given back (the job was requeued) and still ending: it needs a new one
                self.track(existing, job_id)  # submitted before (an sbatch that timed out, a crash)
                self.refresh()
                return Provisioned(Provision.WAITING, "Slurm: submitted")
            kind = self._kind(request.target)
            gpu_type = request.gpu_type
            shape = slurmjob.pack([_replica(r) for r in request.replicas], kind)
            if gpu_type and kind.gpu_type and gpu_type.lower() == kind.gpu_type.lower():
                gpu_type = kind.gpu_type  # Slurm's own spelling of the type (h100 for H100)
            output = self.logs_dir / str(job_id) / "slurm-%j.out"
            output.parent.mkdir(parents=True, exist_ok=True)
            owner = request.run_as
            if owner is not None:  # Slurm writes it as the job's user, who may not create files there
                output = Path(os.devnull)
            argv = slurmjob.sbatch_args(shape, slurmjob.job_name(self.scope, job_id), request.time_limit, request.grace,
                                        request.target, request.account if "account" in self.forward else None,
                                        request.qos if "qos" in self.forward else None, gpu_type, str(output),
                                        request.exclusive, request.constraint)
            if owner is not None:  # as root: the allocation is the user's, as if they ran sbatch
                argv = [f"--uid={owner.uid}", f"--gid={owner.gid}", *argv]
            slurm_id = self.cli.submit(argv, slurmjob.HOLD_SCRIPT)
            submitted = f"Slurm job {slurm_id}"
            log.info("job %s: Slurm job %s asks for %s", job_id, slurm_id, shape)
            self.track(slurm_id, job_id)
            self.refresh()
            with self.lock:
                alloc = self.by_id[slurm_id]
                if owner is not None:
                    alloc.owner = (owner.uid, owner.gid)
        if alloc.running and alloc.specs:
            return Provisioned(Provision.READY, submitted=submitted)
        if alloc.info is None:
            return Provisioned(Provision.WAITING, "Slurm: submitted", submitted)
        reason = alloc.info.reason if alloc.info.reason not in ("", "None") else alloc.info.state.capitalize()
        return Provisioned(Provision.WAITING, reason, submitted)

    def step_identity(self, slurm_id: str) -> list[str]:
        """What ``srun`` run as root needs to start a step in another user's allocation: that
        user (Slurm refuses root's own steps there, and they would run as root)."""
        owner = self.step_owner(slurm_id)
        return [] if owner is None else [f"--uid={owner[0]}", f"--gid={owner[1]}"]

    def step_owner(self, slurm_id: str) -> tuple[int, int] | None:
        """(uid, gid) of the account a root server's steps in this allocation run as; None for
        the server's own allocations and a server that is not root."""
        if os.geteuid() != 0 or not slurm_id:
            return None
        with self.lock:
            alloc = self.by_id.get(slurm_id)
        if alloc is None or alloc.job_id is None:
            return None  # the server's own allocation
        if alloc.owner is None:  # found again after a restart: ask Slurm whose it is
            try:
                uid, gid = self.cli.run("squeue", "-h", "-j", slurm_id, "-o", "%U %G").split()[:2]
                alloc.owner = (int(uid), int(gid))
            except (SlurmError, ValueError):
                return None
        uid, gid = alloc.owner
        return None if uid == 0 else (uid, gid)

    def _kind(self, partition: str | None) -> slurmjob.NodeKind:
        key = partition or ""
        if key not in self._kinds:
            self._kinds[key] = self.cli.node_kind(partition)
        return self._kinds[key]

    def allocation(self, job_id: int) -> tuple[Fate, str]:
        with self.lock:
            slurm_id = self._by_job.get(job_id)
            alloc = self.by_id[slurm_id] if slurm_id else None
            info = alloc.info if alloc is not None else None
        if alloc is not None and not alloc.checked:
            return Fate.LIVE, "not asked yet"  # found again, Slurm not asked about it yet: unknown is not gone
        state = info.state if info is not None else "GONE"
        if state in LIVE_STATES:
            return Fate.LIVE, state
        if state in REQUEUED_STATES:
            self.keep_on_release(job_id)  # the requeue that follows waits for this Slurm job
            return Fate.REQUEUED, f"Slurm requeued its allocation (job {slurm_id})"
        words = f"Slurm ended its allocation (job {slurm_id}: {state.lower()})" if slurm_id else \
            "its Slurm allocation is gone (no Slurm job of it is known)"
        if state in ("TIMEOUT", "DEADLINE"):
            return Fate.TIMEOUT, words
        if state == "CANCELLED":
            return Fate.CANCELLED, words
        return Fate.ENDED, words

    def holds(self, job_id: int) -> bool:
        with self.lock:
            return job_id in self._by_job

    def slurm_id(self, job_id: int) -> str | None:
        with self.lock:
            return self._by_job.get(job_id)

    def keep_on_release(self, job_id: int) -> None:
        """Slurm requeued the job's allocation: when corral requeues the job, keep waiting for
        the same Slurm job instead of cancelling it."""
        with self.lock:
            self._kept.add(job_id)

    def prune(self, keep: set[int]) -> None:
        """Cancel allocations whose corral job ended (or was cancelled while Slurm held it)."""
        with self.lock:
            gone = [j for j in self._by_job if j not in keep]
        for job_id in gone:
            self.release(job_id)

    def ended(self, job_id: int, state: str) -> None:
        """How the corral job ended, for its allocation's end (``release``)."""
        if state:
            with self.lock:
                self._ends[job_id] = state

    def release(self, job_id: int) -> None:
        with self.lock:
            if job_id in self._kept:
                self._kept.discard(job_id)
                return
            slurm_id = self._by_job.pop(job_id, None)
            alloc = self.by_id.pop(slurm_id, None) if slurm_id else None
            if slurm_id:
                # it still runs for a few seconds under the job's name; a requeued job asking
                # for nodes meanwhile must not take it for its own again (``_provision``)
                clock = time.monotonic()
                self._released = {k: t for k, t in self._released.items() if clock - t < RELEASED_TTL_S}
                self._released[slurm_id] = clock
            if alloc is not None:
                for node in alloc.nodes:
                    self._node_alloc.pop(node, None)
                self.version += 1
        if not slurm_id:
            return  # not a job of Slurm's
        try:
            for extra in self.cli.by_name(slurmjob.job_name(self.scope, job_id)):
                if extra != slurm_id:
                    self.cli.cancel(extra)
        except SlurmError:
            log.warning("could not look for other Slurm jobs of job %s", job_id)
        # the job ended: its allocation ends as the job did in Slurm's accounting (its batch
        # script exits 0 on SIGUSR1: COMPLETED, 1 on SIGUSR2: FAILED; a cancelled job's is
        # cancelled), so sacct agrees with corral
        state = self._ends.pop(job_id, "")
        if state in CANCELLED_STATES:
            self.cli.cancel(slurm_id)
            return
        self._end_holder(slurm_id, "USR2" if state in FAILED_STATES else "USR1", 0)

    def _end_holder(self, slurm_id: str, signal: str, tries: int) -> None:
        """Signal the allocation's hold script to end it; again a little later while it lives
        (a signal sent before its batch step runs is lost, though scancel accepts it), and
        cancel it once that has not worked for a while."""
        if tries:
            try:
                info = self.cli.jobs([slurm_id]).get(slurm_id)
            except SlurmError:
                info = None
            if info is None or info.state in ENDED:
                return
        if tries >= HOLDER_TRIES or not self.cli.cancel(slurm_id, signal=signal, batch=True):
            self.cli.cancel(slurm_id)
            return
        timer = threading.Timer(HOLDER_RETRY_S, self._end_holder, (slurm_id, signal, tries + 1))
        timer.daemon = True
        timer.start()

    def host_of(self, node: str) -> str:
        """The machine a node of the pool is (its name where no allocation of it is known)."""
        try:
            return self.where(node)[1]
        except LaunchError:
            return node

    def misfit(self, target: str | None, replicas: list[ReplicaShape], timeout: float) -> str | None:
        """Why no allocation of the Slurm partition ``target`` can hold these replicas (its node
        shape, read at most every minute), or None; a Slurm that is slow to answer is skipped."""
        key = target or ""
        seen = self._shapes.get(key)
        if seen is None or time.monotonic() - seen[0] > SHAPE_TTL_S:
            try:
                seen = (time.monotonic(), self.cli.node_kind(target, timeout=timeout))
            except SlurmRefused as exc:
                return str(exc)
            except SlurmError:
                return None
            self._shapes[key] = seen
        kinds = {t.lower() for t in seen[1].gpu_types}
        wanted = sorted({r.gpu_type for r in replicas if r.gpu_type and r.gpus})
        missing = [t for t in wanted if kinds and t.lower() not in kinds]
        if missing:  # (a partition whose GRES name no type matches any)
            return (f"no node of the Slurm partition has GPU type {', '.join(missing)} (its GPUs are "
                    f"{', '.join(sorted(seen[1].gpu_types))})")
        try:
            slurmjob.pack([_replica(r) for r in replicas], seen[1])
        except ValueError as exc:
            return str(exc)
        return _port_misfit(replicas, seen[1].port_spaces)


def _replica(shape: ReplicaShape) -> slurmjob.Replica:
    return slurmjob.Replica(shape.gpus, shape.cpus, shape.memory, shape.distinct)


def _port_misfit(replicas: list[ReplicaShape], spaces: int) -> str | None:
    """Which declared port more replicas hold than the partition's nodes have addresses (on
    one address, only one of them could listen on it), or None."""
    holders = Counter(p for r in replicas for p in set(r.ports))
    for port, count in sorted(holders.items()):
        if spaces and count > spaces:
            return (f"{count} replicas declare port {port}, and the Slurm partition's nodes have {spaces} "
                    f"address(es); two replicas cannot listen on one port of one address")
    return None
