"""An attempt's container, on the node's own engine (Podman; Docker takes the same words):
what the attempt's wrapper runs instead of running setup and run on the node itself.

Everything corral promises a replica holds inside: the node's network (its address, ports
and peers are the same; ``--network host``), its name as hostname and the job's hosts file
over ``/etc/hosts`` (so ``task-rank.job`` resolves from any program), the replica's
environment (from a file only the engine reads, never a command line; host-specific paths
such as ``PATH`` are the image's), its working directory, checkpoint and discovery
directories bound at the same paths, its own Unix account (``--user``, where the engine
runs with the server's rights for another account), its GPUs (CDI devices where the node
has NVIDIA's CDI specs, renumbered from 0 as inside any container; elsewhere
``CUDA_VISIBLE_DEVICES`` as given), and its signals (``--init`` forwards them to the
replica's shell).

The wrapper writes nothing of this: the run directory holds the engine's argv (NUL
separated), the pull's, the environment file and the registry login, all made here before
the wrapper starts. Each attempt's container is named for its attempt key and labelled with
its job, task and rank, so ending an attempt (``remove``) and a server that restarted find
it by name. A pull happens once per node for concurrent replicas (a lock per image), its
progress in the replica's log; a failed pull leaves the registry's words for the exit."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.node.proctree import ATTEMPT_VAR, attempt_mark
from corral.node.runfiles import read_small

if TYPE_CHECKING:  # names only: a step's task (``node.stepcontainer``) starts without loading the models
    from corral.auth.accounts import UnixAccount

log = logging.getLogger("corral.node")


@dataclass(frozen=True)
class Container:
    """The container an attempt runs in, on the node's own engine (Podman, Docker): its image,
    the site's and the job's run options, and the registry login for a private image (server,
    user, password: never on a command line). Part of ``executors.contract``, defined here so a
    Ray actor builds one without importing the server's models."""

    image: str
    engine: str = "podman"
    options: tuple[str, ...] = ()  # the site's (config.yaml containers.run_options), then the job's
    login: tuple[str, str, str] | None = None
    mounts: tuple[tuple[str, str], ...] = ()  # the task's file_mounts (remote, source): bound in the container
    # variables of the submitting machine's paths (PATH, LD_LIBRARY_PATH …: ``node.container.HOST_ONLY``)
    # that the task itself sets (envs, secrets, --env): carried in, where the rest stay the image's
    kept: tuple[str, ...] = ()


ARGV_FILE = "container"  # the engine's ``run`` up to and including the image (NUL separated)
PULL_FILE = "pull"
NAME_FILE = "container.name"  # engine and name, for ending it
ENV_FILE = "container.env"
PROFILE_FILE = "container.profile"  # the variables whose values span lines, as shell assignments
ROOTLESS_SHM = "8g"  # a tmpfs's size is a cap: memory is used only as it is written
BOX_DIR = "box"  # in the run directory: the files another account's own engine reads
AUTH_FILE = "auth.json"
REASON_FILE = "reason"  # what a failed pull said
PULL_OUT_FILE = "pull.out"  # the engine's own words while it pulls
RUNNING_FILE = "running"  # the image is there: its container starts (the wrapper's mark)
# a batch script run in its own container (``#SBATCH --container-image``): the script's
# container writes "running" here once its image is on the node (``node.stepcontainer``)
SCRIPT_FILE = "script.container"
SCRIPT_VAR = "CORRAL_SBATCH_BOX_MARK"  # that file's path, in the batch script's environment
STEPS_FILE = "steps.engine"  # a batch script's attempt: the engine (and account) its steps' containers use
STEP_LABEL = "corral.attempt"  # on every container a batch script's step makes: the attempt's key
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")
# paths of the machine the job was submitted from: inside an image its own hold (unless the
# task sets one itself: ``Container.kept``)
HOST_ONLY = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
                       "CONDA_DEFAULT_ENV", "CONDA_EXE", "CONDA_PYTHON_EXE", "CONDA_SHLVL", "MANPATH", "INFOPATH",
                       "TMPDIR", "PS1", "SHELL", "CORRAL_ENV_FILE", "CORRAL_RUN_AS"})
# What a Slurm step sets for itself beside its ``SLURM_*`` variables: passed in with them (a
# user's script reads its node's name as Slurm names it, inside a container as outside).
SLURM_STEP_EXTRA = ("SLURMD_NODENAME",)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SAFE_NAME = re.compile(r"corral-[A-Za-z0-9_.-]{1,240}")
# The shell of the container: setup (in a subshell: its exit ends the attempt with its code),
# then run, in the same container so what setup installed is there for run.
# what a replica's log says last when its setup failed (read back by runtime.logs.last_words)
SETUP_FAILED = "corral: error: setup failed"
# Where the executor signals every process of the container (``SIGNALS_VAR``, ``signal_argv``),
# the run's shell takes the stop signals as outside a container (``corral.node.runner.USER_TRAPS``):
# it ends after its current command, which the signal reached too. Elsewhere the engine's init
# signals this shell alone, which then ends at once and the container with it.
SIGNALS_VAR = "CORRAL_SIGNALS_REACH_ALL"
TRAPS = ('trap exit TERM INT HUP QUIT; trap : USR1 USR2; '
         'case ${CORRAL_STOP_SIGNAL#SIG} in ""|TERM|INT|HUP|QUIT) ;; *) trap exit "${CORRAL_STOP_SIGNAL#SIG}";; esac')
# (no single quote in it: the wrapper holds it in one)
SHELL = (f'if [ -n "${{{SIGNALS_VAR}:-}}" ]; then corral_traps() {{ {TRAPS}; }}; else corral_traps() {{ :; }}; fi; '
         'corral_traps; S=$1; R=$2; set --; if [ -n "$S" ]; then (corral_traps; eval "$S") || { rc=$?; [ "$rc" -gt 128 ] || '
         f'echo "{SETUP_FAILED}, so its run was not started" >&2; exit "$rc"; }}; fi; eval "$R"')
# What the container starts (its image's ENTRYPOINT set aside): the variables that span lines
# (``PROFILE``), then ``SHELL`` in bash where the image has it (SkyPilot's scripts are bash),
# else in its /bin/sh.
PROFILE = "/run/corral-env"
# The container's lifeline (Podman, ``--preserve-fds``): fd 3 is a FIFO whose only writer is the
# attempt's wrapper on the node. The engine runs a container under its own monitor, outside the
# wrapper's processes, so a wrapper killed by its engine (Slurm ending a step or an allocation,
# a Ray worker's death), where no corral is left to remove the container by name, would leave
# it running on the node with its GPUs. Once no writer is left, the read sees EOF and every
# process of the container is killed; ``--rm`` then removes it. Only in a PID namespace of the
# container's own (its pid 1 is the engine's init), so ``kill -1`` reaches nothing else; the
# stop signals are the replica's, not the watcher's.
LIFELINE = ('if [ -e /proc/$$/fd/3 ] && { read -r c < /proc/1/comm; [ "$c" = podman-init ]; } 2>/dev/null; then '
            '(trap "" TERM INT HUP QUIT USR1 USR2; while read -r _; do :; done; kill -9 -1) <&3 >/dev/null 2>&1 & '
            'fi; exec 3<&-; ')
LAUNCH = (LIFELINE + f'if [ -r {PROFILE} ]; then . {PROFILE}; fi; '
          'if command -v bash >/dev/null 2>&1; then exec bash -c "$0" corral-replica "$@"; fi; '
          'exec /bin/sh -c "$0" corral-replica "$@"')
# Run as the job's account before the engine (root's, for another account) binds paths: a bind
# would let it reach a directory whose parents it may not pass on the node.
READS = ('for p; do if [ ! -r "$p" ] || { [ -d "$p" ] && [ ! -x "$p" ]; }; then '
         'echo "corral: the Unix account of the job may not reach $p, which its container would bind" >&2; '
         'exit 126; fi; done')
READS_FILE = "reads"


class ContainerError(Exception):
    """The node cannot run the container (no engine): the attempt is not started."""


def name_of(scope: str, key: str) -> str:
    return _SAFE.sub("-", f"corral-{scope}-{key}")[:250]


def engine_path(container: Container) -> str:
    path = shutil.which(container.engine)
    if path is None:
        raise ContainerError(f"the job runs in container image {container.image}, but this node has no "
                             f"{container.engine} (config.yaml containers.engine names the container engine)")
    return path


def prepare(run_dir: Path, container: Container, *, scope: str, key: str, job_id: int, env: dict[str, str],
            hosts_file: str | None, hostname: str, binds: list[str], account: UnixAccount | None,
            locks: Path, passthrough: tuple[str, ...] = (), keep_entrypoint: bool = False,
            marks: Path | None = None, lifeline: bool = False, mark: str | None = None) -> list[str]:
    """Write the attempt's container files into ``run_dir`` (which exists); the names of
    variables that could not go in (a line break), for the replica's log. ``passthrough``:
    variables (or ``NAME*`` patterns) the node sets only when the attempt starts (a Slurm
    step's GPUs and ids), taken from the engine's own environment then. ``marks``: the job's
    directory on the node (gone with the job), where a pull with a login is remembered for the
    task's other replicas. ``lifeline``: the attempt's wrapper passes the container its
    lifeline (``LIFELINE``) on fd 3. ``mark``: the attempt's ``CORRAL_ATTEMPT``, which every
    process in the container carries as outside it (``proctree.attempt_mark``, the default:
    the attempt ``key`` of ``scope``; a step's task passes its step's, "" for none)."""
    engine = engine_path(container)
    mark = attempt_mark(scope, key) if mark is None else mark
    if any(p.startswith("SLURM_") for p in passthrough):
        passthrough = (*passthrough, *(v for v in SLURM_STEP_EXTRA if v not in passthrough))
    name = name_of(scope, key)
    # Another account's job, started by root: its own (rootless) engine runs its container, as
    # it. Its binds are then resolved with its rights alone, a setuid program in its image is
    # root only in its user namespace, and its images are in its own store (no other job's
    # image, private or planted, answers for a name it asks for).
    rootless = account is not None and os.geteuid() == 0 and account.uid != 0
    box = run_dir
    if rootless:
        box = run_dir / BOX_DIR  # the files its engine reads: its own
        box.mkdir(mode=0o700)
        os.chown(box, account.uid, account.gid)
        os.chmod(run_dir, 0o711)
        locks, marks = box, None
    owner = account.uid if rootless else None
    skipped = sorted(k for k, v in env.items() if "\0" in v or not _NAME.fullmatch(k))
    inside = {k: v for k, v in env.items() if (k not in HOST_ONLY or k in container.kept) and k not in skipped}
    if mark:  # never the job's own value: where a Slurm step sets it, the env given lacks it
        inside[ATTEMPT_VAR] = mark
    spanning = {k: v for k, v in inside.items() if "\n" in v or "\r" in v}  # an env file is one line each
    inside = {k: v for k, v in inside.items() if k not in spanning}
    argv = [engine, "run", "--rm", "--name", name, "--init"] + ([] if keep_entrypoint else ["--entrypoint="]) + (
        ["--preserve-fds=1"] if lifeline and "podman" in os.path.basename(engine) else []) + [
            "--network", "host", "--no-hosts",
            "--label", f"corral.scope={scope}", "--label", f"corral.key={key}", "--label", f"corral.job={job_id}",
            "--label", f"corral.replica={env.get('CORRAL_TASK', '')}-{env.get('CORRAL_REPLICA', '')}"]
    if hostname:
        argv += ["--hostname", hostname]
    if hosts_file:
        argv += ["-v", f"{hosts_file}:/etc/hosts:ro"]
    for path in [*binds, hosts_file or "", *(s for _, s in container.mounts), *(r for r, _ in container.mounts)]:
        if ":" in path or "," in path:  # the engine would read volume options after them
            raise ContainerError(f"{path} holds ':' or ',', which a container's bind cannot take")
    for path in dict.fromkeys(binds):  # the same path inside as outside, so every promised path holds
        if path and os.path.isabs(path):
            argv += ["-v", f"{path}:{path}"]
    home = env.get("HOME") or "/root"
    for remote, source in container.mounts:  # file_mounts: the source itself, at the remote path
        target = home + remote[1:] if remote.startswith("~/") else remote
        argv += ["-v", f"{source}:{target}"]
    if rootless:
        argv += ["--userns=keep-id"]  # the account's own uid and gid inside, as outside
    inside, devices = _gpus(inside, passthrough)
    for device in devices:
        argv += ["--device", device]
    options = list(container.options)
    if "--shm-size" not in options and "--ipc" not in options:
        # replicas of a node share memory (NCCL, DataLoader workers) as outside; a rootless
        # engine cannot join the node's IPC namespace: a /dev/shm as large as PyTorch wants
        argv += ["--shm-size", ROOTLESS_SHM] if rootless else ["--ipc", "host"]
    env_path = box / ENV_FILE
    _private(env_path, "".join(f"{k}={v}\n" for k, v in inside.items()), owner)
    if spanning:  # read by the container's own shell, as its account: its alone
        profile = box / PROFILE_FILE
        _private(profile, "".join(f"export {k}={_quoted(v)}\n" for k, v in spanning.items()),
                 account.uid if account is not None and os.geteuid() == 0 else None)
        argv += ["-v", f"{profile}:{PROFILE}:ro"]
    argv += ["--env-file", str(env_path)]
    for variable in passthrough:
        argv += ["--env", variable]
    argv += options + [container.image]
    prefix = _account_env(account, mark or attempt_mark(scope, key), passthrough) if rootless else []
    _nul(run_dir / ARGV_FILE, prefix + argv)
    _nul(run_dir / READS_FILE, [source for _, source in container.mounts])
    (run_dir / NAME_FILE).write_text(f"{engine}\n{name}\n{account.uid if rootless else ''}\n")
    pulled = marks / _SAFE.sub("-", f"pulled-{env.get('CORRAL_TASK', '')}-{_digest(container.image)}") if marks else None
    node = env.get("CORRAL_NODE") or env.get("SLURMD_NODENAME", "")  # (what a refusal names: the node's own image)
    pull = _pull_argv(box, engine, container, locks, pulled, owner, node)
    _nul(run_dir / PULL_FILE, prefix + pull)
    if rootless:  # read by the account where it runs the attempt itself (a Slurm step started as it)
        for made in (ARGV_FILE, READS_FILE, NAME_FILE, PULL_FILE):
            os.chown(run_dir / made, account.uid, account.gid)
    return skipped


def _account_env(account: UnixAccount, mark: str, keep: tuple[str, ...] = ()) -> list[str]:
    """What the account's engine starts with (run through the wrapper's switch to it): its
    home (the engine's store and runtime are there), nothing of the server's, but the variables
    ``keep`` names (shell patterns, corral's own: a Slurm step's ``SLURM_*``, its GPUs), which
    exist only once the step runs and which the engine passes into the container."""
    fixed = [f"HOME={account.home}", f"USER={account.name}", "PATH=/usr/local/bin:/usr/bin:/bin",
             f"CORRAL_ATTEMPT={mark}"]  # (``proctree.attempt_mark``: its processes are the attempt's)
    if not keep:
        return ["env", "-i", *fixed]
    script = ('kept=(); for v in $(compgen -e); do case $v in ' + "|".join(keep) + ') kept+=("$v=${!v}");; '
              'esac; done; exec env -i "${@:1:4}" "${kept[@]}" "${@:5}"')
    return ["bash", "--noprofile", "--norc", "-c", script, "corral-engine", *fixed]


def _digest(image: str) -> str:
    return hashlib.sha256(image.encode()).hexdigest()[:24]


def local_only(image: str) -> bool:
    """Whether ``image`` names an image built or loaded on the node (``localhost/NAME``, no
    port: Podman's name for them), which no registry serves: the engine would ask
    https://localhost/ for it, whose "connection refused" reads as a registry that may answer
    later. ``localhost:PORT/NAME`` is a registry's."""
    first, slash, _ = image.partition("/")
    return bool(slash) and first == "localhost"


def _pull_argv(run_dir: Path, engine: str, container: Container, locks: Path, mark: Path | None,
               owner: int | None = None, node: str = "") -> list[str]:
    auth = ""
    if container.login is not None:
        server, user, password = container.login
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        auth = str(run_dir / AUTH_FILE)
        _private(Path(auth), json.dumps({"auths": {server or "docker.io": {"auth": token}}}), owner)
    locks.mkdir(parents=True, exist_ok=True)
    digest = _digest(container.image)
    lock, private, failed = locks / f"{digest}.lock", locks / f"{digest}.private", locks / f"{digest}.failed"
    # An image once pulled with a login is pulled again (the registry checks the login) for
    # every job, also one without a login: a private image in the node's cache is no one's to
    # run without the registry's yes (Kubernetes' AlwaysPullImages, for private images only).
    # Once per job (per task: its login), not per replica: the task's replicas on this node and
    # its restarts find the job's mark ($5) the registry's yes to its login.
    # A pull that fails leaves its words ($6) for the replicas that waited for it on this node:
    # they fail with them rather than each pulling again (one failed pull, not one per replica);
    # a replica that comes later pulls anew. The engine's progress goes to the replica's log as
    # it pulls (stdout); only the registry's words go to stderr, for the wrapper's reason.
    # A node's own image (``local_only``: $9 says why) that is not there is not pulled: an
    # "Error:" line (the wrapper keeps those for the reason) naming the node ($10) is a lasting
    # refusal (``REFUSALS``).
    script = ('before=$(cat "$6" 2>/dev/null); exec 9>>"$7" && flock 9 || exit; '
              'if [ -z "$3" ] && [ ! -e "$4" ] && "$1" image exists "$2"; then exit 0; fi; '
              'if [ -n "$3" ] && [ -n "$5" ] && [ -e "$5" ] && "$1" image exists "$2"; then exit 0; fi; '
              'if [ -n "$9" ]; then "$1" image exists "$2" && exit 0; '
              'printf "Error: image %s is not on node %s: %s\\n" "$2" "${10:-$(uname -n)}" "$9" >&2; exit 125; fi; '
              'now=$(cat "$6" 2>/dev/null); if [ -n "$now" ] && [ "$now" != "$before" ]; then '
              'echo "corral: the pull of $2 that a replica beside this one made on this node just failed"; '
              'printf "%s\\n" "${now#* }" >&2; exit 125; fi; '
              'echo "corral: pulling $2"; { "$1" pull ${3:+--authfile "$3"} "$2" 2>&1; echo "$?" > "$8.rc"; } | tee "$8"; '
              'rc=$(cat "$8.rc" 2>/dev/null || echo 1); '
              'if [ "$rc" -ne 0 ]; then said=$(grep -i error "$8" | tail -n 1 | cut -c 1-400); '
              '{ printf "%s %s\\n" "$$-$(date +%s%N)" "$said" > "$6"; } 2>/dev/null; printf "%s\\n" "$said" >&2; '
              'exit "$rc"; fi; rm -f "$6" 2>/dev/null; '
              'if [ -n "$3" ]; then : > "$4" || exit; { [ -z "$5" ] || : > "$5"; } 2>/dev/null || :; fi')
    return ["sh", "-c", script, "corral-pull", engine, container.image, auth, str(private),
            str(mark) if mark else "", str(failed), str(lock), str(run_dir / PULL_OUT_FILE),
            LOCAL_ONLY if local_only(container.image) else "", node]


# What a registry says when it refuses an image for good: a new attempt would meet the same
# words (a wrong name or tag, a login it does not take), so it is not pulled again and again.
# Anything else (a registry that does not answer, a timeout, a server error) may pass. A node's
# own image (``local_only``) that is not there is refused so too: no registry would ever have it.
LOCAL_ONLY = "localhost/ names an image built or loaded on the node, which no registry serves"
REFUSALS = (LOCAL_ONLY, "manifest unknown", "name unknown", "not found", "unauthorized", "denied",
            "authentication required", "invalid reference format", "invalid username/password",
            "requested access to the resource is denied", "repository name must be lowercase")


def refused(reason: str) -> bool:
    """Whether a failed pull's words (``pull_failure``) are a registry's lasting refusal."""
    said = reason.lower()
    return any(words in said for words in REFUSALS)


def _gpus(env: dict[str, str], passthrough: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """The replica's GPUs as CDI devices where the node describes its NVIDIA GPUs for CDI:
    inside, they are numbered from 0. Elsewhere (no toolkit, declared GPUs), or where the node
    names them only at start (Slurm), the variable is passed as it is."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if not visible or "CUDA_VISIBLE_DEVICES" in passthrough or not any(os.path.exists(p) for p in CDI_SPECS):
        return env, []
    ids = [g for g in visible.split(",") if g]
    env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(ids)))}
    return env, [f"nvidia.com/gpu={g}" for g in ids]


REMOVE_TRIES = 6  # over about 7 s


def remove(run_dir: Path) -> None:
    """End the attempt's container, if it made one (whatever its state); the engine's own
    client may have been killed while the container ran on. The file naming it may be the
    job's account's (a Slurm step's run directory): its engine is run only if it is a real
    engine nobody but root may change, and as the file's owner when that is not this process."""
    path = run_dir / NAME_FILE
    try:
        owner = path.lstat().st_uid
        lines = path.read_text().split("\n")
        engine, name = lines[:2]
        if owner == os.geteuid() and len(lines) > 2 and lines[2].isdigit():
            owner = int(lines[2])  # written by this server: the account whose own engine runs it
    except (OSError, ValueError):
        return
    if not _trusted_engine(engine) or not _SAFE_NAME.fullmatch(name):
        log.warning("not removing container %r: %s is not an engine corral runs", name, engine)
        return
    argv, exists = [engine, "rm", "--force", "--time", "0", "--ignore", name], [engine, "container", "exists", name]
    if owner != os.geteuid():  # a rootless container of the account's: its own engine removes it
        argv, exists = as_account(owner, argv), as_account(owner, exists)
        if argv is None or exists is None:
            return
    # A container whose monitor (conmon) was killed is left "stopping" by a first rm that comes
    # before the engine has noticed; a later one removes it: asked again until it is gone.
    for attempt in range(REMOVE_TRIES):
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
            if subprocess.run(exists, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=60).returncode != 0:
                return
        except (OSError, subprocess.SubprocessError):
            return
        time.sleep(0.5 * (attempt + 1))
    log.warning("container %s is still there after %d removals", name, REMOVE_TRIES)


def note_steps(run_dir: Path, engine: str, uid: int) -> None:
    """Say, for the attempt's end, which engine (as which account) the containers of its batch
    script's steps (``corral.node.stepcontainer``) run on: a step task killed before its engine's
    client removed its container would leave it running."""
    path = shutil.which(engine) if not os.path.isabs(engine) else engine
    if path:
        (run_dir / STEPS_FILE).write_text(f"{path}\n{uid}\n")


def remove_steps(run_dir: Path, key: str) -> None:
    """End every container of the attempt's steps left when it ended (by its label)."""
    try:
        engine, uid = (read_small(run_dir / STEPS_FILE) or "").split("\n")[:2]
        owner = int(uid)
    except (OSError, ValueError):
        return
    if not _trusted_engine(engine):
        return

    def run(argv: list[str]) -> str:
        if owner != os.geteuid():
            argv = as_account(owner, argv) or []
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=60).stdout if argv else ""
        except (OSError, subprocess.SubprocessError):
            return ""

    left = run([engine, "ps", "-aq", "--filter", f"label={STEP_LABEL}={key}"]).split()
    if left:
        run([engine, "rm", "--force", "--time", "0", "--ignore", *left])


def _trusted_engine(engine: str) -> bool:
    """An absolute path to podman or docker that only root may change (nor its directories)."""
    if not os.path.isabs(engine) or os.path.basename(engine) not in ("podman", "docker"):
        return False
    path = Path(engine)
    try:
        for part in [path, *path.parents]:
            info = part.stat()
            if info.st_uid != 0 or info.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


def as_account(uid: int, argv: list[str]) -> list[str] | None:
    """``argv`` run as the Unix account ``uid`` (its groups, its home: a rootless engine's
    store and runtime are there), from a process of root's; None if there is no such account."""
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    groups = ",".join(str(g) for g in os.getgrouplist(entry.pw_name, entry.pw_gid))
    return ["setpriv", f"--reuid={uid}", f"--regid={entry.pw_gid}", f"--groups={groups}", "--",
            "env", "-i", f"HOME={entry.pw_dir}", f"USER={entry.pw_name}", "PATH=/usr/bin:/bin", *argv]


def entry(run_dir: Path, command: list[str]) -> list[str]:
    """``command`` as a container runs it directly (a Slurm step's): after the variables that
    span lines, where there are any (read from ``PROFILE`` by the image's /bin/sh)."""
    if not (run_dir / PROFILE_FILE).exists():
        return command
    return ["/bin/sh", "-c", f'. {PROFILE}; exec "$@"', "corral-entry", *command]


def ended(run_dir: Path) -> tuple[str, bool]:
    """What an ended attempt's pull said ("" when its image was there) and whether it is a
    lasting refusal (``refused``): what its executor reports with its exit."""
    said = pull_failure(run_dir)
    return said, bool(said) and refused(said)


def running(run_dir: Path) -> bool:
    """Whether the attempt's container runs (or ran): its image is there and the engine starts it."""
    return (run_dir / RUNNING_FILE).exists()


def pulling(run_dir: Path) -> bool:
    """Whether the attempt waits for an image (its own container's, or its batch script's)
    before it runs: STARTING, not RUNNING, on every infra while a pull may take minutes."""
    if named(run_dir) is not None:
        return not running(run_dir)
    said = read_small(run_dir / SCRIPT_FILE)
    return said is not None and said.strip() != "running"  # (none: no container to wait for)


def await_script(run_dir: Path, env: dict[str, str], account: UnixAccount | None) -> None:
    """For a batch script run in its own container, the file its container marks once the
    image is there (``pulling``), writable by the job's account alone; nothing otherwise."""
    if "CORRAL_SBATCH_CONTAINER" not in env:
        return
    from corral.auth.accounts import hand_over  # (here: a Ray worker need not import the server's models)

    path = run_dir / SCRIPT_FILE
    hand_over(path, account, run_dir, directory=False)
    env[SCRIPT_VAR] = str(path)


def script_runs(env: dict[str, str]) -> None:
    """Said by a batch script's container once its image is on the node (``await_script``)."""
    path = env.get(SCRIPT_VAR)
    if not path:
        return
    try:  # the file is there already (made by the node's side): never created, never through a link
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        os.write(fd, b"running\n")
    finally:
        os.close(fd)


def pull_failure(run_dir: Path) -> str:
    """What the registry said when the attempt's image could not be pulled ("" if it was)."""
    said = (read_small(run_dir / REASON_FILE) or "").strip()  # (the account's directory: ``runfiles``)
    return f"image pull failed: {said}" if said else ""


def named(run_dir: Path) -> tuple[str, str] | None:
    try:
        engine, name = (read_small(run_dir / NAME_FILE) or "").split("\n")[:2]
        return engine, name
    except ValueError:
        return None


def exec_command(run_dir: Path, command: str) -> str | None:
    """``command`` as a shell line that runs it inside the attempt's container (where another
    engine, a Slurm step, runs it on the node as the container's owner), or None when the
    attempt has no container or its file names no engine corral runs."""
    boxed = named(run_dir)
    if boxed is None or not _trusted_engine(boxed[0]) or not _SAFE_NAME.fullmatch(boxed[1]):
        return None
    return shlex.join(exec_argv(boxed[0], boxed[1], command, None))


def shell_argv(run_dir: Path, command: list[str], tty: bool, term: str | None) -> list[str] | None:
    """``command`` (none: the image's bash, else its sh) started inside the attempt's container
    by its engine (``corral exec``, ``corral shell``), in the container's working directory,
    environment and user; None when the attempt has no container corral runs."""
    boxed = named(run_dir)
    if boxed is None or not _trusted_engine(boxed[0]) or not _SAFE_NAME.fullmatch(boxed[1]):
        return None
    inner = command or ["/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash || exec sh"]
    return once_running(boxed[0], boxed[1], [boxed[0], "exec", "-i", *(["-t"] if tty else []),
                                             *(["-e", f"TERM={term}"] if term else []), boxed[1],
                                             *entry(run_dir, inner)])


# The attempt is RUNNING once its image is there and its engine was told to run it (the
# wrapper's mark); the container itself exists a few hundred ms later. An exec in between
# failed ("no such container"): a `corral exec` right after RUNNING, a first exec probe, a
# stop signal. So an exec waits, a while, for a container not yet created or started.
_WAIT_RUNNING = ('while :; do case $("$0" inspect -f "{{.State.Status}}" "$1" 2>/dev/null) in '
                 '""|created|configured|initialized) sleep 0.1;; *) exit 0;; esac; done')
# bounded in time by ``timeout``, not in tries: each try is an engine process, slow on a busy node
_ONCE_RUNNING = 'w=$1; e=$2; n=$3; shift 3; timeout 5 /bin/sh -c "$w" "$e" "$n" </dev/null >/dev/null 2>&1; exec "$@"'


def once_running(engine: str, name: str, argv: list[str]) -> list[str]:
    """``argv`` (an exec into the container ``name``) once the container runs, or has ended,
    or after 5 s (then the engine says why it cannot)."""
    return ["/bin/sh", "-c", _ONCE_RUNNING, "corral-exec", _WAIT_RUNNING, engine, name, *argv]


def signal_all(engine: str, name: str, signum: int, run_as: str | None) -> None:
    """Send a signal to every process of the attempt's container but its init, from a thread
    of its own (an exec takes a while; the caller is the control loop). The engine's init
    passes a signal to its child (the run's shell) alone, so a program the shell started would
    never see the stop signal, and would lose its grace period with the shell."""
    import signal as signals
    import subprocess
    import threading

    argv = exec_argv(engine, name, f"kill -s {signals.Signals(signum).name.removeprefix('SIG')} -1", run_as)

    def send() -> None:  # what it says matters to no one: a container that just ended need not be signalled
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except (OSError, subprocess.SubprocessError):
            pass

    threading.Thread(target=send, daemon=True, name=f"corral-signal-{name}").start()


def exec_argv(engine: str, name: str, command: str, run_as: str | None) -> list[str]:
    """An exec probe inside the attempt's container: through the account's own engine where
    it runs the container (``run_as`` "uid:gid:groups", from root)."""
    argv = once_running(engine, name, [engine, "exec", name, "/bin/sh", "-c", command])
    if run_as and os.geteuid() == 0 and int(str(run_as).split(":")[0]) != 0:
        return as_account(int(str(run_as).split(":")[0]), argv) or argv
    return argv


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _private(path: Path, text: str, owner: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        if owner is not None:
            os.fchown(fd, owner, -1)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _nul(path: Path, argv: list[str]) -> None:
    path.write_bytes(b"".join(a.encode() + b"\0" for a in argv))
