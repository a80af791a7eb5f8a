"""Launching attempts, after the commit that made their STARTING state and attempt key
durable: every placed replica whose start order allows it (``startorder``) gets its gang's
resources reserved in engines that keep their own accounting (``Reserving``), its
environment (what a replica sees: ``runtime.environment``, the executor's files, a batch
script's Slurm variables), and its start. A start the engine confirms later stays STARTING
until its STARTED event; a start that fails ends the attempt FAILED with the engine's words.

An attempt that runs is RUNNING with the GPUs its engine bound, its probes watched and its
time limit armed; the job is RUNNING once none of its replicas is still starting."""

from __future__ import annotations

import json

from corral.control import startorder
from corral.control.book import Book
from corral.control.carrier import Carrier
from corral.control.discovery import Discovery
from corral.control.inventory import Inventory
from corral.control.probing import Probes
from corral.control.records import JobRec, ReplicaRec, TaskRec
from corral.control.supervisor import AttemptEnded
from corral.control.transitions import Transitions
from corral.auth.accounts import account_to_start
from corral.executors.contract import Container, Gangs, Handle, Launch, LaunchError, Reserving, Started, StepAgents
from corral.metrics import Metrics
from corral.runtime import batchenv
from corral.node import stepagent
from corral.node.container import HOST_ONLY
from corral.node.namedcontainer import NAMED_VAR
from corral.node.runner import STOP_SIGNAL_VAR
from corral.runtime.environment import ReplicaContext, join_paths, replica_env, starting_environment
from corral.scheduler import Allocation
from corral.settings import Settings
from corral.site import ContainersConfig
from corral.states import JobState, ReplicaState


class Launcher:
    def __init__(self, settings: Settings, book: Book, moves: Transitions, inventory: Inventory, carrier: Carrier,
                 probes: Probes, discovery: Discovery, metrics: Metrics, containers: ContainersConfig | None = None):
        self.settings, self.book, self.moves, self.inventory = settings, book, moves, inventory
        self.carrier, self.probes, self.discovery, self.metrics = carrier, probes, discovery, metrics
        self.containers = containers or ContainersConfig()

    def launch_ready(self, now: float) -> None:
        """Launch every placed replica whose start order allows it."""
        checks, self.book.launch_check = self.book.launch_check, set()
        for job_id in sorted(checks):
            job = self.book.active.get(job_id)
            replicas = startorder.launchable(job) if job is not None else []
            if replicas:  # the files exist, and show these replicas, before any of them runs
                self.discovery.publish_job(job, now, launching=frozenset(r.id for r in replicas))
                self._launch(job, replicas, now)

    def _reserve(self, job: JobRec, replicas: list[ReplicaRec]) -> str | None:
        """Hold the replicas' resources in each engine's own accounting, a gang at a time,
        before any starts; the error when an engine refuses."""
        by_infra: dict[str, list[ReplicaRec]] = {}
        for replica in replicas:
            by_infra.setdefault(replica.infra or self.inventory.infra_of_node(replica.node or ""), []).append(replica)
        for infra, group in by_infra.items():
            executor = self.inventory.executors[infra]
            if not isinstance(executor, Reserving):
                continue  # corral's own allocation is the engine's only accounting
            slots = [(r.label, r.node or "", tuple(r.gpus), r.cpus, r.memory) for r in group]
            try:
                executor.reserve(job.id, job.requeues, slots)
            except LaunchError as exc:
                return str(exc)
        return None

    def _lost_unanswered(self, job: JobRec, replicas: list[ReplicaRec], now: float) -> bool:
        """Replicas whose node did not answer at placement are lost with it (as if the engine
        had reported them lost: the supervisor restarts them elsewhere or requeues the job);
        True if there were any, and then none of the job's other replicas start this cycle."""
        lost = [(r, self.book.unanswered.pop(r.id)) for r in replicas if r.id in self.book.unanswered]
        for replica, why in lost:
            self.book.touch(job.id)
            self.book.sched_needed = True
            self.inventory.refresh()  # the node may have left since
            self.inventory.mark_silent(replica.node or "")  # if not: nothing new there for a while
            ended = AttemptEnded(replica.id, None, True, why, node_up=False)
            self.carrier.apply(job, self.carrier.supervisor.attempt_ended(job, replica, ended, now), now)
        if lost:
            self.book.launch_check.add(job.id)  # the others, if the job still starts
        return bool(lost)

    def _launch(self, job: JobRec, replicas: list[ReplicaRec], now: float) -> None:
        if self._lost_unanswered(job, replicas, now):
            return
        refused = self._reserve(job, replicas)
        by_executor: dict[int, tuple[object, list[tuple[ReplicaRec, Launch]]]] = {}
        for replica in replicas:
            executor = self.inventory.of(replica)
            try:
                launch = self.launch_for(job, replica)
                if refused is not None:
                    raise LaunchError(refused)
            except Exception as exc:  # any failure ends the attempt and frees what it held
                self._failed(job, replica, exc, now)
                continue
            by_executor.setdefault(id(executor), (executor, []))[1].append((replica, launch))
        started: list[tuple[ReplicaRec, Launch, Started]] = []
        for executor, group in by_executor.values():
            for (replica, launch), outcome in zip(group, self._start(executor, [launch for _, launch in group])):
                if isinstance(outcome, Exception):
                    self._failed(job, replica, outcome, now)
                    continue
                self.book.by_key[launch.key] = (job.id, replica.id)
                replica.handle = outcome.handle
                started.append((replica, launch, outcome))
        # Recorded once every replica's process is started: the bookkeeping of one start (its
        # state, events, probes, limits) never delays the next replica's process.
        for replica, launch, outcome in started:
            if outcome.confirmed:
                self.running(job, replica, outcome.handle, now, "launched", None, launch, outcome.gpus, outcome.detail)
            else:
                self._unconfirmed(job, replica, launch, outcome, now)
        if startorder.waiting(job):
            self.book.launch_check.add(job.id)  # others may wait for these to start

    @staticmethod
    def _start(executor, launches: list[Launch]) -> list[Started | Exception]:
        """Each launch's ``Started``, or what its start raised; a gang on an engine that starts
        several at once (``Gangs``) in one call."""
        if len(launches) > 1 and isinstance(executor, Gangs):
            return executor.start_gang(launches)
        outcomes: list[Started | Exception] = []
        for launch in launches:
            try:
                outcomes.append(executor.start(launch))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _failed(self, job: JobRec, replica: ReplicaRec, exc: Exception, now: float) -> None:
        """The attempt could not start: FAILED with the engine's words, what it held freed."""
        message = str(exc) if isinstance(exc, LaunchError) else f"{type(exc).__name__}: {exc}"
        replica.ended = ("launch_failed", message)  # the job's own message names it
        self.moves.replica_to(replica, ReplicaState.FAILED, "launch_failed", now, message, ended_at=now)
        self.book.touch(job.id)

    def _unconfirmed(self, job: JobRec, replica: ReplicaRec, launch: Launch, started: Started, now: float) -> None:
        """The engine confirms the start later (a STARTED event): STARTING until then."""
        self.book.unconfirmed.add(replica.id)
        self.moves.journal.replica(replica.id, handle=started.handle)
        whose, image = ("its", launch.container.image) if launch.container is not None \
            else ("its batch script's", batchenv.script_image(launch.env))
        if image:  # a pull may take minutes: STARTING says why
            self.moves.event(job.id, now, replica.label, "pulling",
                             f"STARTING until {whose} container runs (image {image}, "
                             f"pulled first if {replica.node} lacks it)")

    def running(self, job: JobRec, replica: ReplicaRec, handle: Handle, now: float, cause: str,
                message: str | None, launch: Launch | None = None, gpus: tuple[int, ...] | None = None,
                detail: str = "") -> None:
        """An attempt's process runs: RUNNING, with the GPUs the engine bound, its probes and
        time limit armed; the job is RUNNING once none of its replicas is still starting."""
        columns: dict[str, object] = {}
        if gpus is not None and tuple(gpus) != tuple(replica.gpus):
            # the engine bound these GPUs (Ray picks indices itself): show and account those
            replica.gpus = tuple(int(g) for g in gpus)
            alloc = self.book.allocs.get(replica.id)
            node = next((v for v in self.inventory.views if v.name == replica.node), None)
            # accounted as bound where they are the node's own indices (Ray's); a Slurm
            # allocation's node counts its GPUs from 0, while Slurm binds the host's (4, 5 …)
            if alloc is not None and node is not None and all(0 <= g < node.gpus for g in replica.gpus):
                self.book.allocs[replica.id] = Allocation(alloc.task, alloc.rank, alloc.node, replica.gpus,
                                                          alloc.cpus, alloc.memory, alloc.ports)
            columns["gpus"] = list(replica.gpus)
        replica.handle = handle
        replica.started_at = replica.started_at if cause == "adopted" and replica.started_at else now
        replica.ready = job.task(replica.task).service.readiness_of(replica.rank) is None
        self.carrier.arm(job, replica)
        where = f"{detail} " if detail else ""
        self.moves.replica_to(replica, ReplicaState.RUNNING, cause, now,
                              message or f"{where}on {replica.node} at {replica.addr} (attempt {replica.attempt})",
                              handle=handle, started_at=replica.started_at,
                              log_path=str(self.settings.log_file(job.id, replica.label)), ready=replica.ready,
                              kill_at=None, infra=replica.infra, **columns)
        self.watch_probes(job, replica, launch)
        if startorder.waiting(job):
            self.book.launch_check.add(job.id)
        if launch is None:  # confirmed late or adopted: peers see it running now
            self.book.publish.add(job.id)
        if job.state == JobState.STARTING and all(r.state != ReplicaState.STARTING for r in job.replicas):
            job.state = JobState.RUNNING
            job.started_at = job.started_at or now  # a pipeline's later stages keep its first start
            self.moves.journal.job(job.id, state=JobState.RUNNING.value, started_at=job.started_at)
            self.moves.journal.event(job.id, now, "job", "launched", JobState.STARTING.value, JobState.RUNNING.value)
            self.metrics.start_latency.observe(max(0.0, now - job.submitted_at))

    def watch_probes(self, job: JobRec, replica: ReplicaRec, launch: Launch | None = None) -> None:
        if not self.probes.wanted(job, replica):
            return
        launch = launch or self.launch_for(job, replica)
        self.probes.watch(job, replica, self.inventory.of(replica), launch.env, launch.cwd)

    def launch_for(self, job: JobRec, replica: ReplicaRec) -> Launch:
        task = job.task(replica.task)
        executor = self.inventory.of(replica)
        checkpoint = self.settings.checkpoints_dir / str(job.id) / replica.task
        envs = {**task.spec.get("envs", {}), **task.spec.get("secrets", {})}
        peers = job.replicas_of(replica.task)
        master = next((r for r in peers if r.rank == 0), replica)
        ctx = ReplicaContext(
            job_id=job.id, job_name=job.name, is_group=job.is_group, task=replica.task, rank=replica.rank,
            num_replicas=task.num_nodes, node=replica.node or "",
            node_ips=tuple(r.addr or "127.0.0.1" for r in peers),
            addr=replica.addr or "127.0.0.1", gpus=replica.gpus, gpus_per_replica=task.gpus, cpus=task.cpus,
            master_port=task.master_port or 0, checkpoint_dir=str(checkpoint), restart_count=replica.restarts,
            user=job.user, task_envs=tuple(sorted(envs.items())), master_addr=master.addr or "",
            task_nodes=_by_rank(peers, task.num_nodes), job_nodes=tuple(r.node for r in job.members if r.node),
            array_job_id=job.array_job_id, array_index=job.array_index, array_extent=job.array_extent,
            gang_size=task.service.gang_size, domain=job.names_domain)
        env = replica_env(starting_environment(job.world, job.run_as or job.user), ctx)
        own_path = env.get("PYTHONPATH")
        env.update(executor.attempt_env(job.id))
        if "PYTHONPATH" in env and own_path and env["PYTHONPATH"] != own_path:  # corral's resolver first
            env["PYTHONPATH"] = join_paths(env["PYTHONPATH"], own_path)
        for name, port in (replica.ports or task.service.ports).items():
            env[f"CORRAL_PORT_{name.upper()}"] = str(port)
            if task.service.ports.get(name, port) != port:  # it could not have the one declared
                env[f"CORRAL_PORT_{name.upper()}_DECLARED"] = str(task.service.ports[name])
        env["CORRAL_LAUNCH_KEY"] = replica.launch_key
        env[STOP_SIGNAL_VAR] = task.service.stop_signal  # its run's shell stops on it (``node.runner.USER_TRAPS``)
        if task.service.sbatch is not None and task.service.sbatch.role == "batch":
            for name in batchenv.TASK_LAYOUT:  # the batch step's are the job's (none of a step's)
                env.pop(name, None)
            env.update(self._batch_env(job, task, replica))
        if task.service.sbatch is not None and isinstance(executor, StepAgents):
            # steps on the job's other nodes run in their holders (``corral.node.stepagent``)
            shims = batchenv.ensure_shims(self.settings.runtime_dir / "slurm-bin")
            env[stepagent.DIR_VAR] = executor.step_agents_dir(job.id)
            env[stepagent.AGENT_VAR] = str(shims / "corral-stepd")
        workdir = task.spec.get("workdir")
        repo = (workdir["url"], workdir.get("ref")) if isinstance(workdir, dict) else None
        # no workdir (a job submitted without a directory): its user's home, as a login starts;
        # / for a user without an account here, never the directory the server runs in
        cwd = None if repo else (workdir or env.get("HOME") or "/")
        mounts = tuple(sorted((task.spec.get("file_mounts") or {}).items()))
        try:
            account = account_to_start(job.run_as)
        except LookupError as exc:
            raise LaunchError(str(exc)) from None
        return Launch(key=replica.launch_key, job_id=job.id, label=replica.label, node=replica.node or "",
                      gpus=tuple(replica.gpus), cpus=replica.cpus, memory=replica.memory,
                      setup=task.spec.get("setup"), run=task.spec.get("run"), env=env,
                      cwd=cwd, repo=repo, dirs=(str(checkpoint),), run_as=account,
                      container=self._container(task, env, mounts), file_mounts=mounts)

    def _container(self, task: TaskRec, env: dict[str, str], mounts: tuple[tuple[str, str], ...]) -> Container | None:
        """The task's container (``resources.image_id: docker:IMAGE``), with the site's engine
        and options, the job's own options, and a private registry's login as SkyPilot users
        write it (``SKYPILOT_DOCKER_USERNAME`` / ``_PASSWORD`` / ``_SERVER`` in envs or secrets)."""
        resources = task.service.resources
        if resources.image is None:
            return None
        docker = task.service.config.docker if task.service.config is not None else None
        login = None
        if env.get("SKYPILOT_DOCKER_USERNAME") and env.get("SKYPILOT_DOCKER_PASSWORD"):
            server = env.get("SKYPILOT_DOCKER_SERVER") or resources.image.split("/", 1)[0]
            login = (server, env["SKYPILOT_DOCKER_USERNAME"], env["SKYPILOT_DOCKER_PASSWORD"])
        own = {**(task.spec.get("envs") or {}), **(task.spec.get("secrets") or {})}
        # the site's options last: where a job's sets the same flag, the operator's stands
        return Container(resources.image, self.containers.engine,
                         (docker.run_options if docker else ()) + tuple(self.containers.run_options), login, mounts,
                         tuple(sorted(k for k in own if k in HOST_ONLY and not k.startswith("CORRAL_"))))

    def _batch_env(self, job: JobRec, task: TaskRec, replica: ReplicaRec) -> dict[str, str]:
        """A Slurm batch script's variables and its nodes (``corral.runtime.batchenv``): its own
        node first, then those the job's other replicas hold."""
        holders = [replica] + [r for r in job.members if r.id != replica.id and r.node]
        nodes = tuple(batchenv.NodeSlot(r.node or "", tuple(r.gpus), r.cpus, r.addr or "", r.task) for r in holders)
        # SLURM_JOB_NAME and %x are Slurm's name for it (-J as written, else the script's file name)
        ctx = batchenv.BatchContext(job.id, task.service.sbatch.slurm_name or job.name, job.user, job.partition,
                                    job.account, job.qos,
                                    job.time_limit_of(task), job.requeues, job.array_job_id, job.array_index, nodes,
                                    str(task.spec.get("workdir") or task.service.sbatch.submit_dir),
                                    job.array_extent)
        shims = batchenv.ensure_shims(self.settings.runtime_dir / "slurm-bin")
        keep = tuple({**task.spec.get("envs", {}), **task.spec.get("secrets", {}),
                      **((job.world or {}).get("environment") or {})})  # what --export=A,B carried
        env = batchenv.batch_env(task.service.sbatch, ctx, shims, keep)
        # the site's engine and its options, for containers Pyxis's options ask for (``node.stepcontainer``)
        env["CORRAL_CONTAINER_ENGINE"] = self.containers.engine
        env["CORRAL_CONTAINER_OPTIONS"] = json.dumps(list(self.containers.run_options))
        # named containers' files (``node.namedcontainer``): on disk, removed with the job's git
        # workdirs when it ends (``NodeRunner.cleanup_job``)
        env[NAMED_VAR] = str(self.settings.runs_dir.parent / "workdirs" / str(job.id) / "named")
        return env


def _by_rank(replicas: list[ReplicaRec], count: int) -> tuple[str, ...]:
    """The node of each rank of a task ("" where none is placed yet)."""
    nodes = [""] * count
    for replica in replicas:
        if 0 <= replica.rank < count:
            nodes[replica.rank] = replica.node or ""
    return tuple(nodes)
