"""The control loop: the imperative shell around the pure scheduler and the pure replica and
job-group rules. One thread owns every state change. It sleeps until something happens (a
submission, a command, a replica exit, a due time) and runs one coalesced cycle, top to
bottom:

  1. take     — queued commands and new jobs; every few seconds, the store's pending jobs,
                cancels and requeues (what another writer, or a crash, left there);
  2. observe  — what executors observed (starts, exits, losses) and probe answers, each
                turned into decisions by the supervisor;
  3. decide   — cancels and requeues; every job touched (or due) evaluated by the pure
                rules (``supervisor.review``, ``lifecycle.evaluate``); the scheduling pass
                (its starts claimed with a compare-and-swap); provisioning for engines that
                must obtain nodes first;
  4. journal  — every decision's state moves are written and committed, fenced by this
                server's claim on the database;
  5. execute  — only now: signals, kills, releases (``effects``), launches of what may start
                (their results committed in turn), discovery files, service endpoints.

Every step is a component with a narrow interface (``book`` holds what they share); none is
a method of this class. A cycle that fails loses its writes: its memory is rebuilt from the
store and the executors re-adopt their attempts (``recovery``), what it had applied of the
executors' observations is applied again, and the next cycle retries. The rest of the
server reads only the ``LoopView`` published after each cycle, or asks (``ask``) for an
answer computed on this thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import MappingProxyType

from sqlalchemy.orm import Session, sessionmaker

from corral import executors as executor_registry
from corral.control import lifecycle
from corral.control.accounting import Ledger
from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.commands import Change, Command, Commands, Submitted
from corral.control.discovery import Discovery
from corral.control.effects import Effects
from corral.control.autoscaling import Autoscaler
from corral.control.endpoints import Endpoints
from corral.control.inventory import Inventory
from corral.control.journal import Journal
from corral.control.launcher import Launcher
from corral.control.observations import Observations
from corral.control.pipeline import Pipelines
from corral.control.placement import Placer
from corral.control.probing import Probes
from corral.control.provisioning import Provisioning
from corral.control.queue import Queue
from corral.control.records import JobRec, record_of
from corral.control.recovery import Recovery
from corral.control.requeue import Requeues
from corral.control.retention import Housekeeper, Retention
from corral.control.runtimes import RunTimes
from corral.control.scaling import Scaling
from corral.control.scheduling import Scheduling
from corral.control.supervisor import ProbeAnswered, Supervisor
from corral.control.transitions import Transitions
from corral.control.view import CHANGES_KEPT, LoopView, Reads
from corral.executors.contract import Anticipating
from corral.scheduler.durations import DurationModel
from corral.metrics import Metrics
from corral.settings import Settings
from corral.site import Site
from corral.states import JobState, ReplicaState
from corral.store.database import Claim, ClaimLost
from corral.store.tables import Job

log = logging.getLogger("corral.control")

CLAIM_CHECK_S = 1.0  # how often an idle loop makes sure it still owns the database


class ControlLoop:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], site: Site,
                 clock: Callable[[], float] = time.time, write_lock: threading.RLock | None = None,
                 claim: Claim | None = None, on_claim_lost: Callable[[str], None] | None = None):
        self.settings, self.sessions, self.site, self.clock = settings, sessions, site, clock
        self.policy = site.policy
        # One writer at a time in this process: waiting on a Python lock wakes at once, where
        # SQLite's busy handler would sleep in 1–100 ms steps.
        self.write_lock = write_lock or threading.RLock()
        self._claim = claim
        self._claim_checked = 0.0
        self._on_claim_lost = on_claim_lost
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.metrics = Metrics()
        w = site.usage_weights
        self.ledger = Ledger(site.half_life_s, w.gpu, w.cpu, w.memory)
        self.inventory = Inventory(executor_registry.build(settings, site, self._wake.set), site.partition_infra)
        self.book = book = Book()
        self.journal = Journal()
        moves = Transitions(book, self.journal)
        self.effects = Effects(self.inventory, clock)
        self.supervisor = Supervisor()
        self.probes = Probes(self._wake.set, self.metrics)
        self.carrier = Carrier(book, moves, self.effects, self.inventory, self.supervisor, self.probes, self.metrics)
        self.endpoints = Endpoints(book, self.journal)
        self.discovery = Discovery(book, self.inventory, self.endpoints)
        self.launcher = Launcher(settings, book, moves, self.inventory, self.carrier, self.probes, self.discovery,
                                 self.metrics, site.containers)
        placer = Placer(book, moves, self.inventory)
        self.queue = Queue(book, moves)
        self.scaling = Scaling(book, moves, self.carrier, placer)
        self.requeues = Requeues(book, moves, self.carrier, self.queue, self.scaling, self.policy)
        self.pipelines = Pipelines(book, moves, self.effects, self.queue)
        # learned from jobs' ends, once each is committed; a history trusted only within learn_spread
        self.runtimes = RunTimes(self.policy.learn_durations, DurationModel(max_spread=self.policy.learn_spread))
        self.carrier.on_end = self.runtimes.ended
        self.scheduling = Scheduling(book, moves, self.inventory, placer, self.queue, self.requeues, self.scaling,
                                     self.ledger, self.policy, sessions, settings.rescan_interval_s, self.metrics,
                                     self.runtimes)
        self.provisioning = Provisioning(book, moves, self.inventory, self.requeues, site.provisioned,
                                         self.scheduling.set_reason)
        self.observations = Observations(book, moves, self.inventory, self.carrier, self.launcher, self.supervisor)
        self.commands = Commands(book, moves, self.queue, self.scaling)  # its audit is the server's
        self.autoscaler = Autoscaler(book, self.endpoints, self.scaling, self.journal)
        self.recovery = Recovery(book, self.inventory, self.ledger, self.scaling, self.observations)
        self.reads = Reads(book, self.scheduling, self.policy, settings)
        self._asks: list[tuple[Callable[[], object], Future]] = []
        self._asks_lock = threading.Lock()
        self._asked = threading.Event()  # a read was asked for (``ask``)
        self.view = LoopView()
        self._viewed_nodes: list | None = None
        self.cycles = 0
        self.failing_cycles = 0
        self.last_error: str | None = None
        self._next_rescan = 0.0
        self._resync_needed = False
        self.inventory.refresh()
        self._publish_view()
        r = site.retention
        self.housekeeper = Housekeeper(settings, sessions, Retention(r.logs, r.checkpoints,
                                                                      max(1, int(r.max_log_size * 2**30))),
                                       lambda: self.ask(self.reads.live_logs).result(timeout=30), clock)

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        with self.write_lock, self.sessions() as s:
            self.recovery.recover(s, self.clock(), self._commit)
            learned = self.runtimes.seed(s)
            self.runtimes.recover(s, self.book.active)
        log.info("run times learned from %d finished job(s)", learned)
        self._thread = threading.Thread(target=self._run, name="corral-control", daemon=True)
        self._thread.start()
        self.housekeeper.start()

    def stop(self) -> None:
        """Stop the loop; running replicas keep running and are adopted on the next start."""
        self._stopping.set()
        self._wake.set()
        self.housekeeper.stop()
        if self._thread:
            self._thread.join(timeout=10)
        try:
            with self.write_lock, self.sessions() as s:  # keep the usage accrued since the last flush
                self.ledger.flush(s, self.clock(), force=True)
                self._commit(s)
        except Exception:  # the database may be what failed; the next start loses seconds of usage
            log.exception("could not keep the usage accrued since the last flush")
        self.probes.close()
        self.endpoints.close()
        self.inventory.close()
        self.settings.drop_runtime_dir()
        self._answer_asks()

    def notify(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        last = 0.0
        while not self._stopping.is_set():
            timeout = self.settings.poll_interval_s
            due = self.book.next_due()
            if due is not None:
                timeout = max(0.0, min(timeout, due - self.clock()))
            if self.queue.arrivals:  # new jobs wait for a spaced pass (see scheduling)
                timeout = max(0.0, min(timeout, self.scheduling.next_arrival_pass() - time.monotonic()))
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping.is_set():
                break
            self._answer_reads()
            # Coalesce bursts (many submits, many exits) into one cycle instead of one each;
            # reads that come meanwhile are answered, not kept waiting for the cycle.
            pause_end = last + self.settings.min_cycle_interval_s
            while (left := pause_end - time.monotonic()) > 0:
                if self._asked.wait(left):
                    self._asked.clear()
                    self._answer_reads()
            self._wake.clear()
            last = time.monotonic()
            try:
                if self._claim is not None and time.monotonic() - self._claim_checked >= CLAIM_CHECK_S:
                    if not self._claim.check():  # its lock went with its connection, and is not ours again
                        raise ClaimLost("the database's claim is held by another server now")
                    self._claim_checked = time.monotonic()
                if self._resync_needed:
                    self._resync()
                self.cycle()
                self.failing_cycles, self.last_error = 0, None
            except ClaimLost as exc:
                self._claim_lost(str(exc))
                return
            except Exception as exc:  # the loop must outlive one bad cycle; the next one retries
                log.exception("control cycle failed; its writes are lost and the loop's memory is read again")
                self.failing_cycles += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                self._lost_cycle()
                time.sleep(0.2)
            finally:
                self._publish_view()
                self._answer_asks()

    # -- one cycle ------------------------------------------------------------------------------
    def cycle(self) -> None:
        self.cycles += 1
        book = self.book
        with self.write_lock, self.sessions() as s:
            now = self.clock()  # after the lock: an API write that held it is never stamped later than this cycle
            # 1. take
            cancels, requeues = self.commands.take(s, now)
            if self.commands.rescan:
                self.commands.rescan, self._next_rescan = False, 0.0
            if time.monotonic() >= self._next_rescan:
                # The safety net: anything the commands did not bring (another writer of the
                # store, ids committed out of order on PostgreSQL) is found here.
                self._next_rescan = time.monotonic() + self.settings.rescan_interval_s
                self.queue.ingest(s, now)
                cancels += self.commands.requested_cancels(s)
                requeues += self.commands.requested_requeues(s)
            if self.inventory.refresh():
                book.sched_needed = True
            self.ledger.accrue(now, self.scheduling.holdings())
            # 2. observe (what engines did to provisioned nodes first: it explains what follows)
            self.provisioning.follow(s, now)
            self.observations.collect(now, self.quarantine)
            self._probe_answers(now)
            # 3. decide
            self.commands.cancel(s, cancels, now)
            self.requeues.requested(s, requeues, now)
            if self.endpoints:
                self.autoscaler.run(s, now)
            book.due(now)
            dirty, book.dirty = book.dirty, set()
            for job_id in sorted(dirty):
                try:
                    self._evaluate(job_id, now)
                except Exception as exc:  # isolate the job, keep the loop going for the rest
                    log.exception("evaluating job %s failed; failing it", job_id)
                    self.quarantine(book.active.get(job_id), exc, now)
            self.scheduling.run(s, now, lambda: self.journal.flush(s))
            self.provisioning.run(s, now)
            # 4. journal: STARTING is durable before any process exists, ends before records go
            self._commit(s)
            self.observations.committed()
            self.commands.committed()
            # 5. execute
            if self.effects.run() and self.inventory.refresh():
                book.sched_needed = True  # nodes that left with their job are not placed on again
            self.carrier.regrace()
            self.launcher.launch_ready(now)
            self.ledger.flush(s, now)
            self._commit(s)
            self.effects.run()
            self.carrier.regrace()  # journalled by the next cycle's commit; memory rules until then
        self.discovery.publish_marked(now)
        if self.endpoints:  # routing needs no store; an endpoint opened on a new port is journalled
            with self.write_lock:
                self.endpoints.sync(now)
                if self.journal:
                    with self.sessions() as s:
                        self._commit(s)
        if book.dirty or book.launch_check:  # work found while working: look again at once
            self._wake.set()

    def _commit(self, s: Session) -> None:
        if self.journal:
            self.journal.flush(s)
        if self._claim is not None:
            self._claim.fence(s)  # this server still owns the database, checked in the same transaction
        s.commit()
        self.runtimes.committed()

    def _evaluate(self, job_id: int, now: float) -> None:
        job = self.book.active.get(job_id)
        if job is None:
            return
        self.carrier.apply(job, self.supervisor.review(job, now, self.inventory.up), now)
        if job.state == JobState.PREEMPTED:
            self.requeues.finish(job, now)
            return
        if self.pipelines.next_stage(job, now):
            return
        self.carrier.apply(job, lifecycle.evaluate(job.view(), now), now)

    def _probe_answers(self, now: float) -> None:
        for key, kind, ok, detail in self.probes.answers():
            job, replica = self.book.replica_of(key)
            if replica is not None:
                self.carrier.apply(job, self.supervisor.probe_answered(
                    job, replica, ProbeAnswered(replica.id, kind, ok, detail), now), now)

    def quarantine(self, job: JobRec | None, exc: Exception, now: float) -> None:
        """A job the loop cannot handle: its attempts are killed (whole trees) and it fails,
        written straight to the journal (its in-memory state is not to be trusted)."""
        if job is None:
            return
        book = self.book
        book.active.pop(job.id, None)
        book.pending.pop(job.id, None)
        why = f"internal error: {type(exc).__name__}: {exc}"[:500]
        for replica in job.replicas:
            self.carrier.kill_now(job, replica)
            book.by_key.pop(replica.launch_key, None)
            book.free(replica.id)
            if not replica.state.terminal:
                self.journal.replica(replica.id, state=ReplicaState.KILLED.value, ended_at=now, handle=None)
        self.journal.job(job.id, state=JobState.FAILED.value, ended_at=now, message=why)
        self.journal.event(job.id, now, "job", "internal_error", job.state.value, JobState.FAILED.value, why)
        book.publish.discard(job.id)
        self.effects.release(job.id, JobState.FAILED.value)

    # -- a cycle whose writes were lost ---------------------------------------------------------
    def _lost_cycle(self) -> None:
        """Nothing the failed cycle decided happened: its journal and effects are dropped,
        the observations it applied are kept to be applied again, and the loop's memory is
        rebuilt from the store before the next cycle (retried until the store answers)."""
        self.journal.clear()
        self.effects.drop()
        self.observations.restore()
        self.commands.lost()
        self.runtimes.lost()
        self._resync_needed = True

    def _resync(self) -> None:
        self.book.reset()
        self.queue.arrivals = True
        self._next_rescan = 0.0
        self.ledger = self.scheduling.ledger = self.recovery.ledger = self._fresh_ledger()
        with self.write_lock, self.sessions() as s:
            self.recovery.recover(s, self.clock(), self._commit, why="a lost database write")
            self.runtimes.recover(s, self.book.active)
        self._resync_needed = False

    def _fresh_ledger(self) -> Ledger:
        w = self.site.usage_weights
        return Ledger(self.site.half_life_s, w.gpu, w.cpu, w.memory)

    def _claim_lost(self, why: str) -> None:
        """Another server runs this database's jobs now: this one stops at once, and no
        attempt it started may live on beside theirs (never alive twice)."""
        log.error("this server lost its claim on the database (%s): killing its attempts and stopping", why)
        for job in list(self.book.active.values()):
            for replica in job.replicas:
                self.carrier.kill_now(job, replica)
        self.effects.run()
        self.last_error = f"claim lost: {why}"
        self.failing_cycles = max(self.failing_cycles, 3)
        self._publish_view()
        if self._on_claim_lost is not None:
            self._on_claim_lost(why)

    # -- what the rest of the server sees -------------------------------------------------------
    def _publish_view(self) -> None:
        inv, view = self.inventory, self.view
        if inv.nodes is not self._viewed_nodes:  # the inventory changed: copied once per change
            self._viewed_nodes = inv.nodes
            nodes, infra = tuple(inv.nodes), MappingProxyType(dict(inv.node_infra))
            down = tuple((n, inv.down_infra[name]) for name, n in inv.down_nodes.items())
        else:
            nodes, infra, down = view.nodes, view.node_infra, view.down
        unreachable, partitions = view.unreachable, view.down_partitions
        if inv.unreachable != unreachable:  # copied once per change
            unreachable = MappingProxyType(dict(inv.unreachable))
            partitions = MappingProxyType(dict(inv.down_partitions))
        changes = (view.changes + ((self.cycles, self.journal.take_touched()),))[-CHANGES_KEPT:]
        self.view = LoopView(self.cycles, self.failing_cycles, self.last_error, nodes, infra, down,
                             MappingProxyType(self.scheduling.expected_starts), unreachable, partitions,
                             MappingProxyType(self.runtimes.predictions),
                             MappingProxyType(self.book.growth_reasons),  # a new dict each pass, never changed
                             changes)

    def ask(self, read: Callable[[], object]) -> Future:
        """An answer computed on the loop's thread between cycles (reads of its memory, never
        changes): ``loop.ask(loop.reads.held).result(timeout=5)``."""
        future: Future = Future()
        with self._asks_lock:
            self._asks.append((read, future))
        self._wake.set()
        self._asked.set()
        if self._thread is None or not self._thread.is_alive():
            self._answer_asks()  # not running (yet, or any more): answered here, nothing changes it
        return future

    def _answer_reads(self) -> None:
        """Between cycles, answer the reads nothing queued could change at once: the loop's
        memory is what its last cycle committed. With commands queued (a submit, a cancel, a
        scale the reader may have just made) reads wait for the cycle that carries them out,
        so a caller reads its own writes; after a lost cycle, until its memory is read again."""
        if not self.commands and not self._resync_needed:
            self._answer_asks()

    def _answer_asks(self) -> None:
        with self._asks_lock:
            asks, self._asks = self._asks, []
        for read, future in asks:
            try:
                future.set_result(read())
            except Exception as exc:
                future.set_exception(exc)

    # -- what the API and the intake hand over (queued; taken at the next cycle) ----------------
    def put(self, command: Command) -> None:
        self.commands.put(command)
        self._wake.set()

    def change(self, change: Change) -> Future:
        """A change an API caller asked for; the future is answered (an ``Outcome``) once the
        cycle that carried it out is committed."""
        self.put(change)
        return change.future

    def arriving(self) -> None:
        """A submission passed admission and is being stored (an API thread): executors that
        can get ready for a start do so now, while it is stored and scheduled."""
        for executor in self.inventory.executors.values():
            if isinstance(executor, Anticipating):
                executor.anticipate()

    def submitted(self, job: Job) -> None:
        """Hand a just-committed job to the loop (saves it a query); the periodic rescan of
        the store would find it anyway."""
        if not job.hold:
            self.put(Submitted(record_of(job)))

    def misfit(self, partition: str, tasks) -> str | None:  # noqa: ANN001 - spec TaskSpecs
        return self.provisioning.misfit(partition, tasks)
