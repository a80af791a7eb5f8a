"""A batch script's container, or one of its ``srun`` step's tasks' (Pyxis's options, read by
``corral.spec.pyxis``), run on the node's own engine by the process that starts it: corral's
``srun`` for a step's task, the batch shell for a script run with ``#SBATCH --container-image``.

The container is an attempt's container in all but its owner (``corral.node.container``
writes its engine argv: the node's network, the job's names over ``/etc/hosts``, the task's
environment from a private file, ``--init`` for signals, the site's run options), plus what
Pyxis asked: its mounts (``:ro`` read-only, ``tmpfs``), workdir, read-only root, the host's
value for ``--container-env`` variables, the image's entrypoint only when asked. The job's
directory (its hosts, peers and script files) and checkpoint directory are bound at their
own paths, as for every container of corral's.

Who it runs as: the engine is started by the step's own process, so with the job's account's
rights and never more. A job of the server's account runs the engine as the server would; a
job of another account (a root server runs it as that account) runs its own rootless engine,
as enroot runs unprivileged under Pyxis. ``--container-remap-root`` then makes the account
uid 0 inside a user namespace (rootless Podman's default), never real root; without it the
account keeps its own uid inside (``--userns=keep-id``). A job that is root's own is root
inside either way, as under Pyxis.

``--container-name``: a named container's filesystem is kept for the job on each node and
every step naming it runs over it (``corral.node.namedcontainer``), as under Pyxis; each task
still runs in a container of its own, removed when it ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from corral.settings import private_dir
from corral.node import container as engine_files
from corral.node import namedcontainer
from corral.spec.pyxis import StepContainer

ENGINE_VAR = "CORRAL_CONTAINER_ENGINE"  # the site's engine (config.yaml containers.engine)
OPTIONS_VAR = "CORRAL_CONTAINER_OPTIONS"  # the site's run options, JSON (containers.run_options)
BATCH_VAR = "CORRAL_SBATCH_CONTAINER"  # the batch script's own container, JSON (StepContainer)
LABEL = engine_files.STEP_LABEL  # the attempt a step's container belongs to


def task_key(env: dict[str, str], step: str, rank: str) -> str:
    """The key a step's task's container is named by: its attempt's, its step's and its rank,
    and a digest of its job's directory, so that two corral homes' jobs of one id on one
    machine never name two containers alike."""
    return f"{env.get('CORRAL_LAUNCH_KEY', 'step')}.{_home(env)}.s{step}.t{rank}"


def _home(env: dict[str, str]) -> str:
    import hashlib

    return hashlib.sha256((env.get("CORRAL_HOSTS_FILE") or "").encode()).hexdigest()[:6]


class StepContainerError(Exception):
    """The task cannot run in its container: the sentence says why (the step fails)."""


def login_for(container: StepContainer, env: dict[str, str], reference: str) -> tuple[str, str, str] | None:
    """The registry login that pulls the image: enroot's ``USER@`` looked up in the account's
    enroot credentials file (``$ENROOT_CONFIG_PATH/.credentials``, else
    ``~/.config/enroot/.credentials``, netrc lines ``machine HOST login USER password P``),
    else in the job's ``SKYPILOT_DOCKER_USERNAME``/``_PASSWORD`` (``_SERVER``) as SkyPilot users
    write them; with no ``USER@``, the SkyPilot variables where they are set (as for
    ``image_id``). StepContainerError when a ``USER@`` has no password anywhere."""
    registry = reference.split("/", 1)[0]
    sky_user, sky_password = env.get("SKYPILOT_DOCKER_USERNAME"), env.get("SKYPILOT_DOCKER_PASSWORD")
    sky_server = env.get("SKYPILOT_DOCKER_SERVER") or registry
    if container.user is None:
        return (sky_server, sky_user, sky_password) if sky_user and sky_password else None
    password = _netrc_password(env, registry, container.user)
    if password is None and sky_user == container.user and sky_password:
        password = sky_password
    if password is None:
        raise StepContainerError(
            f"--container-image={container.user}@…: no password for {container.user} at {registry}: put "
            f"'machine {registry} login {container.user} password …' in ~/.config/enroot/.credentials, or "
            "SKYPILOT_DOCKER_USERNAME and SKYPILOT_DOCKER_PASSWORD in the job's environment")
    return (registry, container.user, password)


def _netrc_password(env: dict[str, str], registry: str, user: str) -> str | None:
    base = env.get("ENROOT_CONFIG_PATH") or os.path.join(env.get("HOME") or "/nonexistent", ".config", "enroot")
    try:
        words = Path(base, ".credentials").read_text().split()
    except OSError:
        return None
    entries: list[dict[str, str]] = []
    for i, word in enumerate(words[:-1]):
        if word == "machine":
            entries.append({"machine": words[i + 1]})
        elif word in ("login", "password") and entries:
            entries[-1][word] = words[i + 1]
    for entry in entries:
        # enroot's lines name the host, with its port or without it (as curl's netrc does)
        if entry.get("machine") in (registry, registry.split(":")[0]) and entry.get("login") == user \
                and "password" in entry:
            password = entry["password"]
            if password.startswith("$"):  # enroot substitutes these; corral reads variables only, runs nothing
                password = env.get(password[1:].strip("{}"), "") if not password.startswith("$(") else ""
            return password or None
    return None


def engine_options(container: StepContainer, cwd: str, env: dict[str, str]) -> list[str]:
    """What Pyxis's options add to the engine's ``run`` (before the image)."""
    out: list[str] = ["--label", f"{LABEL}={env.get('CORRAL_LAUNCH_KEY', '')}"]
    for mount in container.mounts:
        target = mount.target if mount.target.startswith("/") else os.path.normpath(os.path.join("/", mount.target))
        if mount.source == "tmpfs":
            out += ["--tmpfs", target]
            continue
        source = mount.source if mount.source.startswith("/") else os.path.normpath(os.path.join(cwd, mount.source))
        if not os.path.exists(source):
            raise StepContainerError(f"--container-mounts: {mount.source} does not exist on node "
                                     f"{env.get('SLURMD_NODENAME', '')}".rstrip())
        flags = [f for f in mount.flags if f not in ("bind", "rbind")]
        out += ["-v", f"{source}:{target}" + (f":{','.join(flags)}" if flags else "")]
    home = env.get("HOME")
    if container.mount_home and home and os.path.isdir(home):
        out += ["-v", f"{home}:{home}"]
    if container.workdir:
        out += ["-w", container.workdir]
    if not container.writable:
        out += ["--read-only"]
    if not container.entrypoint:
        out += ["--entrypoint", ""]  # as Pyxis by default: the command runs, not the image's entrypoint
    for name in container.env:
        out += ["--env", name]  # the host's value, over the image's
    if os.geteuid() != 0 and not container.remap_root:
        out += ["--userns", "keep-id"]  # rootless: the account's own uid inside, as under Pyxis
    return out


@dataclass
class Box:
    """One task's container, made by ``prepare``: ``ready`` gets its image (or its named
    container's filesystem), then ``argv(command)`` runs it; ``remove`` ends it."""

    run_dir: Path
    container: StepContainer
    env: dict[str, str]
    engine: str
    site: tuple[str, ...]
    pull_argv: list[str]
    run_argv: list[str]  # the engine's run, up to and including the image
    prefix: list[str] = field(default_factory=list)  # the image's entrypoint, where asked (a named container)

    def ready(self, pull_image: bool = True) -> None:
        """Pull the image if the node lacks it (``pull_image``: not for a step's later tasks,
        the first one pulled it), or find or make the job's named container on this node;
        StepContainerError with the reason the task cannot run."""
        box = self.container
        if box.name is None:
            said = pull(self.run_dir, self.pull_argv) if pull_image else None
            if said is not None:
                raise StepContainerError(f"--container-image: could not pull {box.image}: {said}")
            return
        try:
            directory = namedcontainer.ensure(self.env, box.name, box.name_flag.replace("auto", ""), box.image,
                                              self.engine, lambda: pull(self.run_dir, self.pull_argv), self.site)
        except namedcontainer.NamedError as exc:
            raise StepContainerError(str(exc)) from None
        self.run_argv = self.run_argv[:-1] + namedcontainer.run_options(directory, self.env, box.env, box.workdir)
        self.prefix = namedcontainer.entrypoint(directory) if box.entrypoint else []

    def argv(self, command: list[str]) -> list[str]:
        return self.run_argv + engine_files.entry(self.run_dir, self.prefix + command)

    def remove(self, client_done: bool = False) -> None:
        """End the task's container (its client may have been killed while it ran) and its files.
        ``client_done``: the engine's client ended by itself, its ``--rm`` has removed it."""
        if client_done:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            remove(self.run_dir)


def prepare(container: StepContainer, key: str, env: dict[str, str], cwd: str) -> Box:
    """One task's container; StepContainerError with the reason it cannot run."""
    engine = env.get(ENGINE_VAR) or "podman"
    image = container.image or "localhost/corral-named-container"  # a named one's: its filesystem, not an image
    if shutil.which(engine, path=env.get("PATH")) is None and shutil.which(engine) is None:
        raise StepContainerError(f"--container-image={image}: this node has no {engine} to run it "
                                 "(config.yaml containers.engine names the container engine)")
    site = tuple(json.loads(env.get(OPTIONS_VAR) or "[]"))
    options = site + tuple(engine_options(container, cwd, env))
    if os.geteuid() != 0 and "--shm-size" not in options and "--ipc" not in options:
        # a rootless engine cannot join the node's IPC namespace: a /dev/shm as large as PyTorch wants
        options += ("--shm-size", engine_files.ROOTLESS_SHM)
    login = login_for(container, env, container.image) if container.image else None
    # the attempt's Container (``executors.contract``) in all but its class: a step's task starts
    # in about 0.1 s without loading the models that module brings
    spec = SimpleNamespace(image=image, engine=engine, options=options, login=login, mounts=(), kept=())
    run_dir = Path(tempfile.mkdtemp(prefix="corral-step-"))
    hosts = env.get("CORRAL_HOSTS_FILE") or None
    binds = [str(Path(hosts).parent)] if hosts else []
    binds += [env["CORRAL_CHECKPOINT_DIR"]] if os.path.isdir(env.get("CORRAL_CHECKPOINT_DIR", "")) else []
    # the pull's lock and private-image marks: in a directory of this account's alone, never one
    # another user could have planted in /tmp (a link there would have the pull write through it)
    locks = Path(tempfile.gettempdir()) / f"corral-image-locks-{os.geteuid()}"
    if not private_dir(locks):
        locks = run_dir / "locks"
    try:
        engine_files.prepare(run_dir, spec, scope="step", key=key, job_id=int(env.get("SLURM_JOB_ID") or 0),
                             # a step's host name is its node's, as on a Slurm node (docs/sbatch.md)
                             env=env, hosts_file=hosts, hostname=env.get("SLURMD_NODENAME") or env.get(
                                 "CORRAL_HOSTNAME", ""), binds=binds,
                             account=None, locks=locks, keep_entrypoint=container.entrypoint,
                             # its processes are its batch script's attempt's (set in the step's environment)
                             mark=env.get(engine_files.ATTEMPT_VAR, ""))
    except engine_files.ContainerError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise StepContainerError(str(exc)) from None
    except BaseException:  # (stopped meanwhile: nothing of its files is left)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return Box(run_dir, container, env, engine_files.engine_path(spec), site,
               _read(run_dir / engine_files.PULL_FILE), _read(run_dir / engine_files.ARGV_FILE))


def _read(path: Path) -> list[str]:
    return [w.decode() for w in path.read_bytes().split(b"\0")[:-1]]


def pull(run_dir: Path, argv: list[str]) -> str | None:
    """Pull the image if the node lacks it (once per node, ``corral.node.container``); the
    registry's words when it could not."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if "error" in line.lower()] or done.stderr.splitlines()
    return (lines[-1] if lines else f"exit {done.returncode}")[:400]


def remove(run_dir: Path) -> None:
    """End the task's container (its client may have been killed while it ran) and its files."""
    engine_files.remove(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)


def run(container: StepContainer, key: str, env: dict[str, str], command: list[str], who: str = "corral",
        script: bool = False) -> int:
    """Run ``command`` in the container (the batch script's own, ``#SBATCH --container-image``;
    a task of a step Slurm's own srun started, ``corral.node.slurmstep``) and return its exit
    code (``who`` says its errors); the signals this process gets go to the engine's client, which
    hands them to the container. Its files and container are gone when it returns. A batch
    ``script`` says once its image is there: its replica is STARTING until then."""
    import signal

    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

    def stopped(signum: int, _frame) -> None:  # noqa: ANN001
        raise SystemExit(128 + signum)  # (before the container runs: its files go, secrets included)

    for sig in stops:
        signal.signal(sig, stopped)
    try:
        box = prepare(container, key, env, os.getcwd())
    except StepContainerError as exc:
        print(f"{who}: error: {exc}", file=sys.stderr)
        return 1
    done = False
    try:
        try:
            box.ready()
        except StepContainerError as exc:
            print(f"{who}: error: {exc}", file=sys.stderr)
            return 1
        if script:
            engine_files.script_runs(env)
        proc = subprocess.Popen(box.argv(command), env=env)
        for sig in stops + (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda signum, _frame: proc.poll() is None and proc.send_signal(signum))
        while True:
            try:
                code = proc.wait()
                break
            except InterruptedError:
                continue
        # the client exited by itself, having run the command: with --rm, after removing the container
        done = code >= 0 and code not in (125, 126, 127)
        return 128 - code if code < 0 else code
    finally:
        box.remove(client_done=done)


def main(argv: list[str]) -> int:
    """``corral-container SCRIPT ARGS``: the batch script in the container ``CORRAL_SBATCH_CONTAINER`` names."""
    env = dict(os.environ)
    container = StepContainer.from_json(env[BATCH_VAR])
    return run(container, f"{env.get('CORRAL_LAUNCH_KEY', 'batch')}.{_home(env)}.batch", env, argv, script=True)
