"""The srun executor: replicas are Slurm job steps inside Slurm allocations. slurmd and
slurmstepd start, confine and kill the processes; corral never runs an agent of its own.

Where its nodes come from:

* **corral inside an allocation** — ``corral server start`` under ``salloc``/``sbatch``
  (``SLURM_JOB_ID`` set): the allocation's nodes, with the CPUs, memory and GPUs Slurm gave
  the job on each, are the pool, named by their hostnames; many corral jobs share them
  under corral's queue and fair share.
* **a job group as one Slurm job** — a partition with ``infra: slurm``: each job there is
  submitted to Slurm as one allocation sized to its gang (``slurmjob``); while Slurm keeps it
  pending, ``corral queue`` shows Slurm's reason; once it runs, its nodes join the pool as
  ``s{slurm id}-{host}``, dedicated to that corral job. It is cancelled when the job ends.

Each attempt is ``srun --jobid J -N1 -n1 -w HOST`` with exactly the replica's CPUs, memory
and GPUs (``--gres=gpu:N``, or ``--gres=none``: a step without it would take every GPU of
the node and block the next step), so Slurm's cgroups and GRES binding apply and two
replicas never share a GPU (``--overlap`` would let them, in Slurm 22.05). The step is named
after the attempt's key; its output goes straight to the replica's log (``--output``, written
by slurmstepd, so nothing is lost if the server dies), and the same wrapper as on other
executors writes ``started`` and ``exit_code`` into the attempt's run directory. This assumes
what Slurm sites provide: ``CORRAL_HOME`` on a filesystem shared by the nodes, where a job's
``file_mounts`` sources the nodes may not see are staged first (``node.staging``).

A stop signal reaches the attempt's process group from a small step beside it, SIGKILL cancels
the step (``stepsignals``). Slurm's variables are set over the step's own (``layout``), and srun
gives the step the user's umask. After a server restart, steps are found again by name: a
running one is adopted, an ended one reports its exit (from the exit file, else Slurm's
accounting), and an attempt with neither a step, an ``srun`` alive nor a trace never started.

A controller that does not answer (or a missing ``SLURM_CONF``) never stops the server: the
executor says why (``unreachable``, from ``controller``), its partitions are DOWN until Slurm
answers, and what needs Slurm's word (its allocations, adopting attempts) waits for it."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import threading
import time
from pathlib import Path


from corral.auth.accounts import LOGIN_UMASK, hand_over, open_discovery, peers_readable
from corral.executors.contract import (Allocation as Fate, Binding, EventStream, Handle, Kind, Launch, LaunchError,
                                      Observed, Provisioned, ProvisionRequest, ReplicaShape, ShellError, ShellRequest, Started,
                                      Wake)
from corral.executors.slurm.allocations import ENDED, REQUEUED_STATES, Allocations
from corral.executors.slurm.controller import Controller
from corral.executors.slurm.ports import HostPorts
from corral.executors.slurm.sidesteps import SideSteps, retrying
from corral.executors.slurm.stepsignals import Attempt, StepSignals
from corral.node.mounts import command as mounts_command, seen_at
from corral.node.staging import stage_command, stage_failure
from corral.node.proctree import ATTEMPT_VAR, attempt_mark
from corral.node.runfiles import read_small
from corral.node import container as containers
from corral.node.runner import RUN_AS_VAR, NodeRunner, base_environment, process_start_time
from corral.node.terminal import Terminal
from corral.executors.slurm.cli import SlurmCli, SlurmError, process_alive, srun_clients
from corral.pool import NodeSpec
from corral.executors.slurm.layout import step_variables, user_umask
from corral.runtime.batchenv import hand_over_job_files

log = logging.getLogger("corral.srun")

POLL_S = 0.5
GPUS_FILE = "gpus"
# Run in the step before the wrapper: records the GPUs Slurm bound to it (its GRES binding
# chooses them, not corral), by their indices on the node, then becomes the wrapper.
# It also enters the working directory itself ($2): slurmstepd runs a step it cannot --chdir
# into in /tmp instead, where the replica would run unseen elsewhere than it asked.
RECORD_GPUS = ('printf "%s\\n" "${SLURM_STEP_GPUS:-${CUDA_VISIBLE_DEVICES:-}}" > "$1/gpus"; '
               'if [ -n "$2" ] && ! cd -- "$2" 2>/dev/null; then '
               'echo "corral: the job failed: its working directory $2 cannot be entered on $(hostname)" >&2; exit 1; '
               'fi; shift 2; exec "$@"')
ENDING_GRACE_S = 3.0  # a step whose replica recorded its exit is cancelled if it still runs this long after
ACCOUNTING_WAIT_S = 15.0  # how long a gone step's exit may take to be final in Slurm's accounting


def step_name(scope: str, key: str) -> str:
    """The Slurm step name of an attempt: the server's scope keeps two homes' steps apart."""
    return f"corral-{scope}-{key}"


class SrunExecutor(EventStream):
    name = "slurm"

    def __init__(self, settings, scope: str, wake: Wake = lambda: None, own_allocation: str | None = None,
                 cli: SlurmCli | None = None, forward: tuple[str, ...] = (), file_mounts_max_gb: float = 1.0):
        super().__init__(wake)
        self.scope = scope
        self.stage_limit = int(file_mounts_max_gb * 2**30)  # the largest source staged for the nodes (bytes)
        self.cli = cli or SlurmCli()
        self.settings = settings
        self.runner = NodeRunner(settings.runs_dir, settings.runtime_dir, scope)
        self._base_env = base_environment(os.environ)  # corral's own steps (the reaper), never a replica's
        self._umask = user_umask()
        self._lock = threading.RLock()
        self._live: dict[str, Attempt] = {}
        self.ports = HostPorts()
        self._closed = threading.Event()
        self.own = own_allocation
        self.allocations = Allocations(self.cli, scope, settings.logs_dir, wake, own_allocation, forward)
        self.side = SideSteps(self.cli, self.allocations, scope, self._base_env)
        # Built whether or not Slurm answers: while it does not, its partitions are DOWN with
        # why (``unreachable``), attempts to adopt wait for it, and the watcher asks again.
        self.controller = Controller(self.cli, wake)
        self.signals = StepSignals(self.cli, self.controller, self.runner, self.allocations, self.side)
        self._connected = False
        self._deferred: list[tuple[str, Handle | None]] = []  # attempts to adopt once Slurm answers
        self._connect()
        self._thread = threading.Thread(target=self._watch, name="corral-srun-watcher", daemon=True)
        self._thread.start()
        # once connected, its controller is asked apart from the watcher, whose squeue retries a silent one
        self._pinger = threading.Thread(target=self._ping, name="corral-slurm-ping", daemon=True)
        self._pinger.start()

    # -- reachability (Reachability) ---------------------------------------------------------
    def unreachable(self) -> str | None:
        why = self.controller.why
        if why is None and not self._connected:  # it answers, and its allocations are being found again
            return "Slurm answers; this server is finding its allocations again"
        return why

    def _connect(self) -> bool:
        """Slurm answers: the allocations this server holds are found again, then the attempts
        whose adoption waited for it are adopted."""
        if not self.controller.check():
            return False
        try:
            self.allocations.connect()
        except SlurmError as exc:
            self.controller.failed(str(exc))
            return False
        with self._lock:
            self._connected = True
        self._adopt_deferred()
        with self.allocations.lock:
            self.allocations.version += 1  # the allocations found again: their nodes join the pool
        self._wake_loop()
        return True

    def _adopt_deferred(self) -> None:
        with self._lock:
            deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        try:
            self._adopt(deferred)
        except SlurmError as exc:  # not adopted: they wait for the next answer
            with self._lock:
                self._deferred = deferred + self._deferred
            self.controller.failed(f"Slurm's controller answers but its steps cannot be read: {exc}")

    def _reached(self) -> bool:
        """Whether Slurm answers. Until this server has connected, the watcher asks (when due);
        after that the pinger does, and the watcher reads its answer."""
        if not self._connected:
            return self.controller.due() and self._connect()
        if self.controller.why is None:
            self._adopt_deferred()  # (what a resync asked while it did not answer)
        return self.controller.why is None

    def _ping(self) -> None:
        """Once connected, ask the controller when due; a change of answer wakes the loop."""
        while not self._closed.wait(POLL_S):
            try:
                if self._connected and self.controller.due():
                    self.controller.check()
            except Exception:  # the pinger must outlive a flaky call to Slurm
                log.exception("Slurm controller check failed")

    # -- inventory ---------------------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        return self.allocations.nodes()

    @property
    def inventory_version(self) -> int:
        return self.allocations.version

    # -- provisioning (Provisioner): the allocations' ------------------------------------------
    def provision(self, request: ProvisionRequest) -> Provisioned:
        return self.allocations.provision(request)

    def allocation(self, job_id: int) -> tuple[Fate, str]:
        return self.allocations.allocation(job_id)

    def holds(self, job_id: int) -> bool:
        return self.allocations.holds(job_id)

    def keep_on_release(self, job_id: int) -> None:
        self.allocations.keep_on_release(job_id)

    def prune(self, keep: set[int]) -> None:
        self.allocations.prune(keep)

    def misfit(self, target: str | None, replicas: list[ReplicaShape], timeout: float) -> str | None:
        return self.allocations.misfit(target, replicas, timeout)

    def record_end(self, job_id: int, state: str) -> None:
        self.allocations.ended(job_id, state)

    def release(self, job_id: int) -> None:
        if self.controller.why is not None:
            return  # kept until Slurm answers: then pruned (the job is over), never left behind
        self.allocations.release(job_id)

    # -- binding -------------------------------------------------------------------------------
    def bind(self, job_id: int, replica_id: int, node: str, ports: dict[str, int],
             previous: Binding | None) -> Binding:
        _, host, addr = self.allocations.where(node)
        return self.ports.bind(host, addr, ports, previous)

    def rendezvous_port(self, node: str) -> int:
        _, host, _ = self.allocations.where(node)
        return self.ports.rendezvous(host)

    # -- attempts ------------------------------------------------------------------------------
    def start(self, launch: Launch) -> Started:
        alloc, host, _ = self.allocations.where(launch.node)
        share = next((s for s in alloc.info.nodes if s.host == host), None)
        cpus = max(1, math.ceil(launch.cpus - 1e-9))
        if launch.memory > 0:
            mem_mb = max(1, int(launch.memory * 1024))
        elif share is not None and share.memory_mb > 0:  # no request: a share in proportion to CPUs
            mem_mb = max(1, share.memory_mb * cpus // max(share.cpus, 1))
        else:
            mem_mb = 0
        account = launch.run_as  # another Unix account's job: its step runs as it (srun --uid as root)
        # exactly the replica's environment (runtime.environment), nothing of the server's
        env = {**(account.env() if account else {}), **launch.env, RUN_AS_VAR: ""}
        if launch.gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's GRES binding sets it for the step
        log_file = self.settings.log_file(launch.job_id, launch.label)
        try:  # on the filesystem Slurm's nodes share with the server; written there as the job's user
            hand_over(log_file, account, self.settings.home, directory=False)
            for directory in launch.dirs:
                hand_over(Path(directory), account, self.settings.home)
            if launch.repo is not None and account is not None:  # the step clones it there as the account
                hand_over(self.runner.repo_dir(launch.job_id, *launch.repo).parent, account, self.settings.home)
            if launch.file_mounts:  # the step makes them on its node, as the account, in the job's record
                hand_over(self.runner.mounts_dir(launch.job_id), account, self.settings.home)
        except OSError as exc:
            raise LaunchError(str(exc)) from exc
        layout = step_variables(env, alloc, self.allocations)  # (env: a batch script's made as under sbatch)
        if launch.container is not None:  # a stop signal reaches every process in it (``sidesteps``)
            env[containers.SIGNALS_VAR] = "1"
        boxed = launch.container
        if boxed is not None and boxed.mounts:  # each source as the job sees it: the copy staged, or the path
            record = self.runner.mounts_dir(launch.job_id)
            boxed = dataclasses.replace(boxed, mounts=tuple((remote, str(seen_at(record, source)))
                                                            for remote, source in boxed.mounts))
        try:
            # a step of another account cannot make namespaces: its names resolve through the files
            wrapper = self.runner.command(launch.key, launch.job_id, launch.setup, launch.run, env,
                                          launch.hosts and account is None, "", launch.repo, boxed,
                                          account)
        except (OSError, ValueError) as exc:
            raise LaunchError(str(exc)) from exc
        wrapper = ["bash", "-c", RECORD_GPUS, "corral-gpus", str(self.runner.run_dir(launch.key)),
                   launch.cwd or ""] + layout + wrapper
        if launch.file_mounts and launch.container is None:  # made by the step first (node.mounts); a container binds them
            wrapper = mounts_command(self.runner.mounts_dir(launch.job_id), launch.file_mounts, env.get("HOME") or "",
                                     str(self.runner.run_dir(launch.key))) + ["--"] + wrapper
        step = step_name(self.scope, launch.key)
        argv = ["srun", f"--jobid={alloc.slurm_id}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                f"--job-name={step}", f"--cpus-per-task={cpus}", f"--gres=gpu:{len(launch.gpus)}" if launch.gpus
                else "--gres=none", "--kill-on-bad-exit=1", f"--output={log_file}", "--open-mode=append",
                # the key marks every process of the attempt on its node (the wrapper and the reaper
                # find them by it), not the srun client here
                "--input=none", f"--export=ALL,{ATTEMPT_VAR}={attempt_mark(self.scope, launch.key)}",
                *self.allocations.step_identity(alloc.slurm_id)]
        if mem_mb:
            argv.append(f"--mem={mem_mb}M")
        if launch.cwd:
            argv.append(f"--chdir={launch.cwd}")
        # root's srun never carries another account's variables (BASH_ENV, LD_PRELOAD): its step reads them
        client_env = {**(self.runner.server_side_env(launch.key, env, account, owner=account) if account else env),
                      **self.cli.conf, RUN_AS_VAR: ""}
        srun = argv + wrapper
        if launch.file_mounts:
            # sources the nodes may not see are first copied into the job's record (which they do
            # see), as the account, by the process that then becomes this srun: off the loop, and
            # the srun keeps its pid (node.staging)
            srun = stage_command(self.runner.mounts_dir(launch.job_id), launch.file_mounts, self.stage_limit,
                                 str(self.runner.run_dir(launch.key)), str(log_file),
                                 (account.uid, account.gid, tuple(account.groups)) if account else None) + ["--"] + srun
        srun_log = self._srun_log(launch.key)
        try:
            with open(srun_log, "ab") as out:
                if account is not None:  # its step records its start, GPUs and exit there, as the account
                    run_dir = self.runner.run_dir(launch.key)
                    os.chown(run_dir, account.uid, account.gid)
                    open_discovery(self.runner.runtime_dir, self.runner.job_dir(launch.job_id))
                    hand_over_job_files(self.runner.job_dir(launch.job_id), env, account, self.runner.runtime_dir)
                # srun gives the step its own umask (SLURM_UMASK): the user's, not the server's private one
                proc = subprocess.Popen(srun, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=client_env, start_new_session=True, close_fds=True,
                                        umask=LOGIN_UMASK if account is not None else self._umask)
        except (OSError, ValueError) as exc:
            raise LaunchError(f"srun could not be started: {exc}") from exc
        started = process_start_time(proc.pid)
        handle = {"key": launch.key, "node": launch.node, "slurm": alloc.slurm_id, "step": step, "pid": proc.pid,
                  "started_at": started}
        attempt = Attempt(launch.key, alloc.slurm_id, launch.node, step, proc, proc.pid, started,
                          unconfirmed={"handle": handle, "detail": f"step {step} of Slurm job {alloc.slurm_id} "
                                                                   f"(srun pid {proc.pid})"})
        with self._lock:
            self._live[launch.key] = attempt
        # running once its step runs the wrapper, with the GPUs Slurm chose (the watcher confirms)
        return Started(handle, confirmed=False, detail=f"srun pid {proc.pid}")

    def bound_gpus(self, key: str) -> tuple[int, ...] | None:
        """The GPUs Slurm bound to the attempt's step (node indices), once its step recorded them."""
        text = read_small(self.runner.run_dir(key) / GPUS_FILE)  # (the account's directory: ``runfiles``)
        if text is None:
            return None
        text = text.strip()
        try:
            return tuple(int(g) for g in text.split(",")) if text else ()
        except ValueError:  # not indices (UUIDs): corral's own choice stays what it shows
            return None

    def _runs(self, key: str) -> bool:
        """Whether the attempt's wrapper runs in its step and, in a container, its container
        does (while its image is pulled the replica is still starting)."""
        run_dir = self.runner.run_dir(key)
        if self.runner.started_pid(key) is None:
            return False
        return not containers.pulling(run_dir)

    def _confirm(self, attempt: Attempt) -> None:
        pending, attempt.unconfirmed = attempt.unconfirmed, None
        if pending is not None:
            boxed = containers.named(self.runner.run_dir(attempt.key))
            detail = pending["detail"] + (f", in container {boxed[1]}" if boxed else "")
            self._emit(Observed(attempt.key, Kind.STARTED, handle=pending["handle"], node=attempt.node,
                                gpus=self.bound_gpus(attempt.key), detail=detail))

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        with self._lock:
            if not self._connected or self.controller.why is not None:
                # Slurm cannot tell whether they run: never taken for gone, adopted once it answers
                self._deferred.extend(attempts)
                return
        self._adopt(attempts)

    def _adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        self.allocations.refresh()
        with self.allocations.lock:
            ids = list(self.allocations.by_id)
        steps = retrying(lambda: self.cli.steps(ids)) if ids else {}
        clients = srun_clients()  # srun commands still alive, by the step name they create
        for key, handle in attempts:
            step = step_name(self.scope, key)
            slurm_id = (handle or {}).get("slurm") or ""
            pid, pid_started = int((handle or {}).get("pid") or 0), (handle or {}).get("started_at")
            client_alive = bool(pid) and process_alive(pid, pid_started)
            if not client_alive and step in clients:
                # its handle was never stored (the server died while srun waited for its step):
                # the srun is still there and will start it, so the attempt is not absent
                pid, pid_started = clients[step]
                client_alive = True
            if step in steps or client_alive:
                slurm_id = slurm_id or steps.get(step, "").split(".")[0]
                attempt = Attempt(key, slurm_id, (handle or {}).get("node", ""), step, None,
                                  pid if client_alive else 0, pid_started)
                adopted = dict(handle or {"key": key, "step": step, "slurm": slurm_id})
                if self.runner.started_pid(key) is not None and not self._runs(key):  # still pulling its image
                    attempt.unconfirmed = {"handle": adopted, "detail": f"step {step} of Slurm job {slurm_id}"}
                with self._lock:
                    self._live[key] = attempt
                if attempt.unconfirmed is None:
                    self._emit(Observed(key, Kind.STARTED, handle=adopted, gpus=self.bound_gpus(key)))
                continue
            why = self._allocation_ended(slurm_id)
            ended = self._ended(key, slurm_id, step, None)
            if ended is not None and why:
                ended = _lost_with_allocation(ended, why, (handle or {}).get("node", ""))
            if ended is None:  # accounting has not finalised its step yet: watch it a little longer
                with self._lock:
                    self._live[key] = Attempt(key, slurm_id, (handle or {}).get("node", ""), step, None, 0, None,
                                              gone_since=time.monotonic())
                self._emit(Observed(key, Kind.STARTED, handle=dict(handle or {"key": key, "step": step,
                                                                              "slurm": slurm_id})))
                continue
            self._emit(ended)

    def _ended(self, key: str, slurm_id: str, step: str, client_rc: int | None,
               waited: float = ACCOUNTING_WAIT_S) -> Observed | None:
        """The attempt's step is gone: its exit from the wrapper's file, else the srun client's
        code, else Slurm's accounting once final (None: not final yet, ask again); never
        started: ABSENT."""
        # a step Slurm ended itself (scancel, its time limit) leaves its container under the
        # engine's monitor, outside the step's processes: Podman's ends it by its lifeline to
        # the wrapper (corral.node.container.LIFELINE) on any node; removed here too, where the
        # engine is the server machine's (a lab, one host), which also covers Docker
        containers.remove(self.runner.run_dir(key))
        code = self.runner.exit_code(key)
        if code is not None:
            staging = stage_failure(self.runner.run_dir(key))  # its sources could not be staged: no step ran
            if staging:
                return Observed(key, Kind.EXITED, code=code, reason=staging, permanent=True)
            said, permanent = containers.ended(self.runner.run_dir(key))
            return Observed(key, Kind.EXITED, code=code, reason=said, permanent=permanent)
        started = self.runner.started_pid(key) is not None
        if not started and client_rc is None:
            return Observed(key, Kind.ABSENT, reason="its Slurm step never started the replica")
        if not started:  # srun gave up (the allocation ended, Slurm refused the step): say why
            return Observed(key, Kind.LOST, reason=f"Slurm did not start the step: {self._srun_said(key)}")
        if client_rc is not None:
            return Observed(key, Kind.EXITED, code=128 - client_rc if client_rc < 0 else client_rc)
        recorded = self.cli.step_exit(slurm_id, step) if slurm_id else None
        if recorded is not None and recorded[1] is not None:
            return Observed(key, Kind.EXITED, code=recorded[1],
                            reason="" if recorded[0] == "COMPLETED" else f"Slurm: step {recorded[0].lower()}")
        if waited < ACCOUNTING_WAIT_S:
            return None
        return Observed(key, Kind.LOST, reason="its Slurm step ended and left no exit code")

    def _srun_said(self, key: str) -> str:
        try:
            lines = self._srun_log(key).read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1][:300] if lines else "srun ended without a message"

    def signal(self, handle: Handle, signum: int) -> bool:
        with self._lock:
            attempt = self._live.get(handle["key"])
        return attempt is not None and self.signals.send(attempt, signum)

    def _allocation_ended(self, slurm_id: str) -> str | None:
        """Why Slurm ended the allocation the attempt ran in (an operator's scancel, a node
        failure, its time limit), or None while it runs or corral released it itself."""
        with self.allocations.lock:
            alloc = self.allocations.by_id.get(slurm_id) if slurm_id else None
        if alloc is None or not alloc.checked:
            return None
        if alloc.info is None:
            return f"Slurm ended its allocation (job {slurm_id} is gone)"
        if alloc.info.state in ENDED:
            return f"Slurm ended its allocation (job {slurm_id}: {alloc.info.state.lower()})"
        return None

    def forget(self, handle: Handle) -> None:
        self.runner.forget(handle["key"])
        self._srun_log(handle["key"]).unlink(missing_ok=True)

    def _srun_log(self, key: str) -> Path:
        """What the attempt's srun client said: beside its run directory, which may be the job's
        account's (the server never reads through a link that account could plant)."""
        return self.runner.runs_dir / f"{key}.srun.log"

    # -- discovery, probes, logs ------------------------------------------------------------------
    def publish(self, job_id: int, nodes: set[str], hosts: str, peers: str) -> None:
        self.runner.publish(job_id, hosts, peers)  # on the shared filesystem: every node reads it
        peers_readable(self.runner.job_dir(job_id))  # read by replicas that may run as other accounts


    def attempt_env(self, job_id: int) -> dict[str, str]:
        return self.runner.attempt_env(job_id, None)

    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        try:
            _, host, _ = self.allocations.where(handle.get("node", ""))
        except LaunchError as exc:
            return False, str(exc)
        run_dir = self.runner.run_dir(handle["key"])
        # inside its container, by the engine that runs it (the account's own, if rootless)
        command = containers.exec_command(run_dir, command) or command
        return self.side.probe(str(handle.get("slurm") or ""), host, command, env, cwd, timeout, run_dir)

    def open_shell(self, handle: Handle, request: ShellRequest) -> Terminal:
        """A step beside the replica's on its node, in its world (``Shells``; ``SideSteps.shell``)."""
        key = handle["key"]
        with self._lock:
            live = key in self._live
        if not live or self.runner.started_pid(key) is None:
            raise ShellError("its step is not running")
        try:
            _, host, _ = self.allocations.where(handle.get("node", ""))
        except LaunchError as exc:
            raise ShellError(str(exc)) from None
        run_dir = self.runner.run_dir(key)
        boxed = containers.shell_argv(run_dir, list(request.argv), request.tty, request.env.get("TERM"))
        if boxed is None and containers.named(run_dir) is not None:
            raise ShellError("its container is not one corral can enter (its engine or name changed)")
        try:
            return self.side.shell(str(handle.get("slurm") or ""), host, key, run_dir, request, boxed)
        except (OSError, ValueError) as exc:
            raise ShellError(f"srun could not be started: {exc}") from exc

    def cleanup_job(self, job_id: int) -> None:
        self.runner.cleanup_job(job_id)

    def close(self) -> None:
        # steps and allocations outlive the server: the next one adopts them
        self._closed.set()
        self._thread.join(timeout=5)
        self._pinger.join(timeout=5)

    # -- the watcher thread -------------------------------------------------------------------------
    def _watch(self) -> None:
        next_queue = 0.0
        while not self._closed.wait(POLL_S):
            try:
                if not self._reached():
                    continue  # nothing else is asked of a controller that does not answer
                if time.monotonic() >= next_queue:
                    next_queue = time.monotonic() + 2 * POLL_S
                    self.allocations.refresh()
                self._check_attempts()
            except Exception:  # the watcher must outlive a flaky call to Slurm
                log.exception("srun watcher step failed")

    def _check_attempts(self) -> None:
        with self._lock:
            live = list(self._live.values())
        if not live:
            return
        for attempt in live:  # its wrapper runs: the step started (an end is reported after this)
            if attempt.unconfirmed is not None and self._runs(attempt.key):
                self._confirm(attempt)
        try:
            steps = self.cli.steps(sorted({a.slurm_id for a in live if a.slurm_id}))
        except SlurmError as exc:  # unknown is not gone: look again at the next tick
            log.warning("could not list Slurm steps: %s", exc)
            return
        refreshed = False
        for attempt in live:
            if attempt.step in steps:
                if attempt.ending is None and self.runner.exit_code(attempt.key) is not None:
                    attempt.ending = time.monotonic()
                elif attempt.ending is not None and not attempt.step_cancelled and \
                        time.monotonic() - attempt.ending >= ENDING_GRACE_S:
                    # the replica's main process ended and its step still runs: what it left behind
                    # (a script's background srun clients) ends with its step, as a batch step's does.
                    # Not at once: a step normally ends by itself a moment after its wrapper
                    attempt.step_cancelled = True
                    self.cli.cancel(steps[attempt.step])
                continue
            rc = None
            if attempt.proc is not None:
                rc = attempt.proc.poll()
                if rc is None:
                    continue  # srun waits for its step to be created
            elif attempt.pid and process_alive(attempt.pid, attempt.pid_started):
                continue
            # neither its step nor its srun is there: it ended (srun's own end may race the step's
            # listing, so look once more before reporting)
            try:
                if attempt.slurm_id and attempt.step in self.cli.steps([attempt.slurm_id]):
                    continue
            except SlurmError:
                continue
            if not refreshed:  # the allocation's state now, not a second old: a requeue ends steps too
                self.allocations.refresh()
                refreshed = True
            with self.allocations.lock:
                alloc = self.allocations.by_id.get(attempt.slurm_id)
            state = alloc.info.state if alloc is not None and alloc.info is not None else ""
            if state == "COMPLETING" and (attempt.gone_since is None or
                                          time.monotonic() - attempt.gone_since < ACCOUNTING_WAIT_S):
                attempt.gone_since = attempt.gone_since or time.monotonic()
                continue  # the allocation is ending or being requeued: its fate decides what this was
            if state in REQUEUED_STATES:
                with self._lock:
                    self._live.pop(attempt.key, None)
                if alloc.job_id is not None:  # the job's requeue must wait for this Slurm job, not cancel it
                    self.allocations.keep_on_release(alloc.job_id)
                self._emit(Observed(attempt.key, Kind.LOST, reason=f"Slurm requeued its allocation "
                                                                   f"(job {attempt.slurm_id})"))
                continue
            if attempt.gone_since is None:
                attempt.gone_since = time.monotonic()
            why = self._allocation_ended(attempt.slurm_id)
            waited = ACCOUNTING_WAIT_S if why else time.monotonic() - attempt.gone_since
            ended = self._ended(attempt.key, attempt.slurm_id, attempt.step, rc, waited)
            if ended is None:
                continue  # accounting not final yet
            if why:
                ended = _lost_with_allocation(ended, why, attempt.node)
            with self._lock:
                self._live.pop(attempt.key, None)
            self._emit(ended)


def _lost_with_allocation(ended: Observed, why: str, node: str) -> Observed:
    """An attempt whose step went with its allocation: the replica did not end on its own,
    so it is lost (the exit Slurm's signals gave it is not its own), unless it recorded a
    plain exit code first (it ended before the allocation did) or never started."""
    if ended.kind == Kind.ABSENT or (ended.kind == Kind.EXITED and ended.code is not None and ended.code < 128):
        return ended
    return Observed(ended.key, Kind.LOST, node=node or None, reason=why)
