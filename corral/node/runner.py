"""What runs attempts on one node: the part of an executor that must live where the
processes live. The local executor uses it in the server process; the Ray executor runs it
inside an actor on the node Ray placed the replica on. It owns pids, exit files, the
attempt's process tree, the job's hosts file and exec probes; nothing above it sees them.

Each attempt has its own run directory (``runs/KEY``), never shared with another attempt:
the wrapper writes ``started`` as its first act and ``exit_code`` as its last, so after a
crash an attempt that never started is told apart from one that ran and ended.

Names resolve for every program, not only Python: where this process may create a mount
namespace (root, or CAP_SYS_ADMIN), each attempt runs in its own one with the job's hosts
file (the machine's ``/etc/hosts`` plus the job's names) bound over ``/etc/hosts``, so
``curl``, ``getent``, C, Go and Java programs resolve ``task-rank.job`` through the system
resolver, and in its own UTS namespace with that name as its hostname (as a Kubernetes pod
is named), so libraries that advertise ``gethostname()`` to peers (gloo, NCCL's bootstrap)
give the replica's own address. A thread of this process makes those namespaces as it starts
the wrapper (``corral.node.namespaces``: no extra program per start); the wrapper makes them
itself (``unshare``, ``mount``) where that thread cannot, and when ``srun`` starts it on a
Slurm node. Elsewhere names resolve inside Python (an injected ``sitecustomize``) and through
``CORRAL_HOSTS_FILE``; ``hosts_mode`` says which holds."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from corral.node import container as containers
from corral.node.container import (LAUNCH as CONTAINER_LAUNCH, READS as CONTAINER_READS, SETUP_FAILED,
                                   SHELL as CONTAINER_SHELL)
from corral.node import binds
from corral.node.mounts import attach_as, detach_as_owner
from corral.node.namespaces import NamespaceError, NamespaceSpawner
from corral.node.network import Bridge
from corral.node.proctree import ATTEMPT_VAR, REAP, ProcessTrees, attempt_mark
from corral.node.runfiles import read_small
from corral.node.stepagent import DIR_VAR as STEP_AGENTS_VAR

if TYPE_CHECKING:  # (annotations only: a Ray worker imports this module for every replica actor it
    # starts, and the server's models — pydantic, the pool, the job spec — would double its import)
    from corral.auth.accounts import UnixAccount
    from corral.executors.contract import Container

# Traps (not ignores) so the wrapper survives the group signal long enough to record the
# exit code, while its children start with default signal dispositions. Its first acts put
# it in the attempt's cgroup (children inherit it), bind the hosts file (inside its own mount
# namespace), name it, and record that it started; its last, before recording the exit, end
# whatever its replica left running (a child that called setsid escapes its process group,
# and on Slurm without proctrack/cgroup its step too), so an exit is never recorded while
# anything of the attempt still runs.
#
# Those first acts are on every launch's critical path, so they overlap: moving a process
# into a cgroup may wait for an RCU grace period in the kernel (cgroup_threadgroup_rwsem taken
# for writing: 5-15 ms on a busy 2-core machine, see ProcessTrees.warm), so ``mount`` (where
# the wrapper binds the hosts file itself) starts in the background first and the wrapper
# moves itself ($$) into the attempt's cgroup while it runs: the move needs no child of its
# own. The hostname is written through /proc (no program to start; ``hostname`` only where
# /proc/sys is read-only). The ``wait`` is what keeps the tree whole: nothing the wrapper
# forks later starts before the wrapper is in its cgroup, and the helper forked before the
# move has exited by then.
# The job's environment for a replica that runs as another account than the wrapper's: read by
# the account's own shell from fd 4 (NUL-separated NAME=value, written by the server, opened
# before the switch), never set in any process of the server's rights, where BASH_ENV, PATH or
# LD_PRELOAD would run the job's code as root. A shell already of the job's account (a Slurm
# step started with --uid) reads it from the file itself.
LOAD_ENV = 'while IFS= read -r -d "" kv; do export -- "$kv" 2>/dev/null; done <&4; exec 4<&-; '
# What a process of the server's rights starts with when it runs for another account's job.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_FILE_VAR = "CORRAL_ENV_FILE"
NO_NEW_PRIVS_MARK = "no_new_privs"  # in an attempt's run directory: it runs with no_new_privs

STOP_SIGNAL_VAR = "CORRAL_STOP_SIGNAL"  # the task's stop_signal, where it is not one of the four
USER_TRAPS = ('trap exit TERM INT HUP QUIT; trap : USR1 USR2; '
              f'case ${{{STOP_SIGNAL_VAR}#SIG}} in ""|TERM|INT|HUP|QUIT) ;; *) trap exit "${{{STOP_SIGNAL_VAR}#SIG}}";; esac')

WRAPPER = REAP + r"""
corral_stopping=  # (set, never inherited: the job's own variables reach this shell too)
trap 'corral_stopping=1' TERM INT HUP QUIT
trap : USR1 USR2 PIPE
case ${CORRAL_STOP_SIGNAL#SIG} in ""|TERM|INT|HUP|QUIT) ;; *) trap 'corral_stopping=1' "${CORRAL_STOP_SIGNAL#SIG}";; esac
as=$CORRAL_RUN_AS; unset CORRAL_RUN_AS; drop=
if [ -n "$as" ]; then r=${as#*:}; drop="setpriv --reuid=${as%%:*} --regid=${r%%:*} --groups=${r#*:} --"
elif [ -n "$CORRAL_ENV_FILE" ]; then """ + LOAD_ENV.replace("<&4; exec 4<&-", '< "$CORRAL_ENV_FILE"') + r"""fi
if [ -n "$5" ]; then mount --bind "$5" /etc/hosts 2>/dev/null & fi
if [ -n "$4" ]; then { printf '%s\n' "$$" > "$4"; } 2>/dev/null; fi
if [ -n "$6" ]; then { printf '%s' "$6" > /proc/sys/kernel/hostname; } 2>/dev/null || hostname "$6" 2>/dev/null; fi
until wait; do :; done
printf '%s\n' "$$" > "$1/started"
exec 3>&2
rc=0
AS_USER='""" + LOAD_ENV + r"""cd -- "$1" || exit 1; script=$2; set --; """ + USER_TRAPS + r"""; eval "$script"'
USER_ENV="env -i PATH=/usr/bin:/bin CORRAL_ATTEMPT=$CORRAL_ATTEMPT"
SETUP_FAILED='""" + SETUP_FAILED + r"""'
CONTAINER_SHELL='""" + CONTAINER_SHELL + r"""'
CONTAINER_LAUNCH='""" + CONTAINER_LAUNCH + r"""'
CONTAINER_READS='""" + CONTAINER_READS + r"""'
if [ -n "$7" ]; then
  mkdir -p "${7%/*}" && {
    flock 9 && if [ ! -d "$7/.git" ]; then
      echo "corral: cloning $8${9:+ at $9} into $7" >&3
      rm -rf "$7.part" && mkdir "$7.part" && { [ -z "$as" ] || chown "${as%%:*}:${r%%:*}" "$7.part"; } &&
      $drop git clone -q -- "$8" "$7.part" 2>&3 &&
      { [ -z "$9" ] || $drop git -C "$7.part" -c advice.detachedHead=false checkout -q "$9" -- 2>&3; } && mv "$7.part" "$7"
    fi
  } 9>"$7.lock" && cd "$7"; rc=$?
  [ "$rc" -eq 0 ] || echo "corral: could not clone $8${9:+ at $9} (exit $rc)" >&3
fi
if [ "$rc" -eq 0 ] && [ -f "$1/container" ]; then
  mapfile -d '' -t c < "$1/reads"
  # what the engine binds with root's rights, the job's account must reach itself
  [ -z "$drop" ] || $drop $USER_ENV sh -c "$CONTAINER_READS" corral-reads "$PWD" "${c[@]}" 2>&3; rc=$?
  [ "$rc" -eq 0 ] && { mapfile -d '' -t c < "$1/pull"; $drop "${c[@]}" 2>"$1/pull.err" >&3; rc=$?; [ "$rc" -eq 0 ] || { if [ -s "$1/pull.out" ]; then grep -vxF -f "$1/pull.out" "$1/pull.err"; else cat "$1/pull.err"; fi; } >&3 2>/dev/null; }
  if [ "$rc" -ne 0 ] && [ -s "$1/pull.err" ]; then grep -i 'error' "$1/pull.err" | tail -n 1 | cut -c 1-400 > "$1/reason"; elif [ "$rc" -ne 0 ]; then :; else
    mapfile -d '' -t c < "$1/container"; image=${c[-1]}; unset 'c[-1]'; : > "$1/running"
    # the container's lifeline (corral.node.container.LIFELINE): this shell is its only writer
    rm -f "$1/lifeline"; mkfifo -m 600 "$1/lifeline" && exec 8<>"$1/lifeline" || { echo "corral: could not make $1/lifeline" >&3; rc=1; }
    if [ "$rc" -eq 0 ]; then { $drop "${c[@]}" -v "$PWD:$PWD" -w "$PWD" "$image" /bin/sh -c "$CONTAINER_LAUNCH" "$CONTAINER_SHELL" "$2" "$3" 2>&3 3<"$1/lifeline" 8>&-; } 2>/dev/null; rc=$?; fi
    exec 8>&-
  fi
else
  if [ "$rc" -eq 0 ] && [ -n "$2" ]; then { (script=$2; set --; trap - PIPE; """ + USER_TRAPS + r"""; [ -z "$drop" ] || exec $drop $USER_ENV bash --noprofile --norc -c "$AS_USER" corral-replica "$PWD" "$script" 4<"$CORRAL_ENV_FILE"; eval "$script") 2>&3 3>&-; } 2>/dev/null; rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -gt 128 ] || echo "$SETUP_FAILED, so its run was not started" >&3; fi
  if [ "$rc" -eq 0 ] && [ -z "$corral_stopping" ] && [ -n "$3" ]; then { (script=$3; set --; trap - PIPE; """ + USER_TRAPS + r"""; [ -z "$drop" ] || exec $drop $USER_ENV bash --noprofile --norc -c "$AS_USER" corral-replica "$PWD" "$script" 4<"$CORRAL_ENV_FILE"; eval "$script") 2>&3 3>&-; } 2>/dev/null; rc=$?; fi
fi
# stopped: what the run started may still be saving its work (its shell ended first); the
# attempt lives until it is done, or until corral's SIGKILL once the grace period is over
if [ -n "$corral_stopping" ] && [ -n "$CORRAL_ATTEMPT" ]; then corral_linger "$CORRAL_ATTEMPT" "$4"; fi
if [ -n "$CORRAL_ATTEMPT" ]; then corral_reap "$CORRAL_ATTEMPT" "$4"; fi
printf '%s\n' "$rc" > "$1/exit_code"
exit "$rc"
"""
# A job of another Unix account (CORRAL_RUN_AS="uid:gid:groups", set by the server running as
# root) has its setup, run and git clone started through ``setpriv`` as that account, with its
# supplementary groups; the wrapper's own bookkeeping (cgroup, namespaces, run files, reaping)
# stays the server's. The replica enters its working directory again as the account, so a
# directory the account may not reach is refused, not entered on the server's rights.
#
# The user's setup and run execute in subshells (a fork, no new bash) with no positional
# arguments of the wrapper; their stderr is the log (fd 3) while the wrapper's own
# "Terminated" notices go to /dev/null. The exit file is only read once the wrapper has
# exited, so a plain write is enough.
#
# Signals (``USER_TRAPS``): a stop signal reaches the attempt's process group, the script's
# shell and the program it runs alike. A shell with default handling would die at once, and
# the attempt with it, taking the grace period from a program that saves a checkpoint on the
# signal; a shell that ignored it would pass that on to every program it starts. So the
# script's shell *handles* the stop signals by ending once its current command has (with that
# command's exit status: `python train.py` that checkpoints and exits 0 ends the run with 0),
# and USR1/USR2 (``signal_before_timeout``) by carrying on; what it starts gets default
# handling (a handler, unlike an ignored signal, does not survive exec). After a stop the
# wrapper waits for the rest of the attempt (programs started in the background) before it
# reaps: corral's SIGKILL at the end of the grace period ends what is still there.

EXIT_FILE = "exit_code"
STARTED_FILE = "started"
START_TIME_TOLERANCE_S = 0.05
RUN_AS_VAR = "CORRAL_RUN_AS"
STEP_ENGINE_VAR = "CORRAL_CONTAINER_ENGINE"  # a batch script's (``corral.node.stepcontainer``)
# what a Slurm step learns only when it starts, passed into its container then
STEP_VARIABLES = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_*")


def run_as_value(account: UnixAccount | None) -> str:
    """What the wrapper reads in ``CORRAL_RUN_AS``: "uid:gid:groups" ("" for the server's own)."""
    if account is None:
        return ""
    return f"{account.uid}:{account.gid}:{','.join(str(g) for g in account.groups) or account.gid}"


# What corral's own helper steps (the Slurm reaper) take of the server's environment. A
# replica takes nothing of it: its environment is built whole by ``runtime.environment``.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
             "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
             "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")


def base_environment(environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in INHERITED or k.startswith("LC_")}


def process_start_time(pid: int) -> float | None:
    """The start time of a process that still runs: None for a zombie too. A replica
    adopted after a crash is no child of ours, so when it dies it waits as a zombie until
    its new parent reaps it (in a container, maybe never); counting that zombie as alive
    would report its exit late and out of order."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _hostname(env: dict[str, str]) -> str:
    """The attempt's host name: its replica's name, but a batch script's node's (steps run by
    corral's own ``srun``) is the node's, as ``hostname`` on a Slurm node is a name of the
    job's ``SLURM_JOB_NODELIST`` (its hosts file resolves it)."""
    if env.get(STEP_AGENTS_VAR) and env.get("CORRAL_NODE"):
        return env["CORRAL_NODE"][:64]
    return env.get("CORRAL_HOSTNAME", "")[:64]


def _mount_namespaces() -> bool:
    """Whether an attempt can get a private mount namespace with /etc/hosts bound over."""
    if shutil.which("unshare") is None or shutil.which("mount") is None or not os.path.exists("/etc/hosts"):
        return False
    try:
        done = subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "true"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class Spawning:
    """A wrapper's start under way (``NodeRunner.begin_spawn``): ``result`` is its Popen, made
    on the namespace thread or, where that thread could not make its namespaces (nothing was
    forked then), by the wrapper making them itself; never the machine's network in place of
    a bridge's. Raises what the start raised (OSError, ValueError) with nothing left running."""

    def __init__(self, queued: Future | None, fallback: Callable[[], subprocess.Popen],
                 refused: NamespaceError | None, needs: str = ""):
        """``needs``: what only the namespace thread can give the start (its network, its binds)."""
        self._queued, self._fallback, self._refused, self._needs = queued, fallback, refused, needs

    def result(self) -> subprocess.Popen:
        refused = self._refused
        if self._queued is not None:
            try:
                return self._queued.result()
            except NamespaceError as exc:
                refused = exc
        if refused is not None and self._needs:  # the wrapper cannot wire a network, nor bind mounts
            raise OSError(f"its {self._needs} could not be made: {refused}") from None
        return self._fallback()


class NodeRunner:
    def __init__(self, runs_dir: Path, runtime_dir: Path, scope: str, bridge: Bridge | None = None,
                 spawn_threads: int = 1):
        """``spawn_threads``: how many starts may be forked side by side (a gang's, on a node
        that runs many attempts; one where a runner starts one attempt, as in a Ray actor)."""
        self.runs_dir = runs_dir
        self.runtime_dir = runtime_dir
        self.trees = ProcessTrees(scope)
        self.bridge = bridge  # every attempt in a network namespace of its own, on this bridge
        self.hosts_mode = "mount-namespace" if bridge is not None or _mount_namespaces() else "python"
        self._spawner: NamespaceSpawner | None = None  # made at the first start that needs it
        self._spawner_tried = False
        self._spawn_threads = spawn_threads
        self._spawner_lock = threading.Lock()
        # file_mounts bound in each replica's own namespace (``node.binds``), never linked on the
        # machine: the executor hands them to ``begin_spawn`` instead of linking them
        self.binds = self.hosts_mode == "mount-namespace" and os.geteuid() == 0

    # -- attempts -------------------------------------------------------------------------
    def run_dir(self, key: str) -> Path:
        return self.runs_dir / key

    def command(self, key: str, job_id: int, setup: str | None, run: str | None, env: dict[str, str],
                hosts: bool, procs: str = "", repo: tuple[str, str | None] | None = None,
                container: Container | None = None, account: UnixAccount | None = None) -> list[str]:
        """The wrapper's command line for an attempt (run here, or by another engine on the
        node: the srun executor hands it to ``srun``); its run directory must not exist yet.
        With ``hosts`` (and namespaces allowed) the wrapper makes its own namespaces."""
        self.run_dir(key).mkdir(parents=True, exist_ok=False)  # a key is never reused
        containers.await_script(self.run_dir(key), env, account)  # (into the caller's env: the step's)
        if container is not None:  # the step's own variables (its GPUs, ids) exist only once it starts
            self._container(key, job_id, container, env, account, None, STEP_VARIABLES)
        return self._argv(key, job_id, setup, run, env, hosts and self.hosts_mode == "mount-namespace", procs, repo)

    def _argv(self, key: str, job_id: int, setup: str | None, run: str | None, env: dict[str, str],
              namespaces: bool, procs: str, repo: tuple[str, str | None] | None,
              hostname: str | None = None) -> list[str]:
        hosts_file = ""
        argv = ["bash", "-c", WRAPPER, "corral-replica", str(self.run_dir(key)), setup or "", run or "", procs]
        name = ""
        if namespaces:
            hosts_file = str(self._ensure_hosts(job_id))
            argv = ["unshare", "--mount", "--uts", "--propagation", "private"] + argv
            name = _hostname(env) if hostname is None else hostname
        argv += [hosts_file, name]
        if repo is not None:  # cloned by the wrapper (its output is the replica's log), once per job here
            url, ref = repo
            argv += [str(self.repo_dir(job_id, url, ref)), url, ref or ""]
        return argv

    def spawn(self, key: str, job_id: int, setup: str | None, run: str | None, env: dict[str, str],
              cwd: str | None, log_path: Path, hosts: bool, umask: int = -1,
              repo: tuple[str, str | None] | None = None, account: UnixAccount | None = None,
              container: Container | None = None, address: str | None = None,
              file_mounts: tuple[tuple[str, str], ...] = (), home: str = "") -> subprocess.Popen:
        """Start the attempt's wrapper in its own session (it outlives the server) and
        return its Popen; raises OSError (bad cwd, no bash) with nothing left running.
        With ``hosts``, where namespaces are allowed, it starts inside its own (made by
        the namespace thread, or failing that by the wrapper). With ``account`` the replica's
        own processes run as that Unix account (the wrapper drops to it before exec). With a
        bridge, in a network namespace of its own at ``address``, or not at all."""
        return self.begin_spawn(key, job_id, setup, run, env, cwd, log_path, hosts, umask, repo, account,
                                container, address, file_mounts=file_mounts, home=home).result()

    def begin_spawn(self, key: str, job_id: int, setup: str | None, run: str | None, env: dict[str, str],
                    cwd: str | None, log_path: Path, hosts: bool, umask: int = -1,
                    repo: tuple[str, str | None] | None = None, account: UnixAccount | None = None,
                    container: Container | None = None, address: str | None = None,
                    warm: bool = True, file_mounts: tuple[tuple[str, str], ...] = (), home: str = "") -> Spawning:
        """``spawn`` whose fork may still be under way on the namespace thread when it returns:
        the caller prepares a gang's next replica meanwhile, and takes each one's Popen (or its
        OSError) from ``Spawning.result``, which every caller must call. ``warm=False``: the
        caller has had the kernel's grace period started already (a gang's first start did).
        ``file_mounts`` (where ``binds``: the caller links none) are bound in the replica's
        namespace, ``~`` being ``home``, and the replica runs with no_new_privs (``node.binds``)."""
        pending = (account, tuple(file_mounts), home) if file_mounts else None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if cwd and not os.path.isdir(cwd):
            raise OSError(f"workdir {cwd!r} is not a directory on this node")
        procs = self.trees.prepare(key) or ""
        if warm:
            self.trees.warm()  # the wrapper's move of itself comes a few ms after the spawn
        self.run_dir(key).mkdir(parents=True, exist_ok=False)  # a key is never reused
        env = {**env, ATTEMPT_VAR: attempt_mark(self.trees.scope, key),  # never the job's own value
               RUN_AS_VAR: run_as_value(account)}
        containers.await_script(self.run_dir(key), env, account)
        if env.get(STEP_ENGINE_VAR):  # a batch script: its steps may make containers of their own
            containers.note_steps(self.run_dir(key), env[STEP_ENGINE_VAR], account.uid if account else os.geteuid())
        name = _hostname(env)
        if container is not None:
            self._container(key, job_id, container, env, account, log_path)
        if account is not None:  # the wrapper keeps root's rights: it never sees the job's variables
            env = self.server_side_env(key, env, account)

        def fork(argv: list[str], workdir: str | None) -> subprocess.Popen:
            with open(log_path, "ab", buffering=0) as log:
                return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=workdir, env=env, start_new_session=True, close_fds=True, umask=umask)

        namespaces = (hosts or self.bridge is not None or pending is not None) and self.hosts_mode == "mount-namespace"
        spawner = self._namespace_spawner() if namespaces else None
        if self.bridge is not None and (spawner is None or not address):
            raise OSError("no network namespace can be made for it here (the namespace thread is not running)")
        bound: list[binds.Bind] = []
        if pending is not None and spawner is not None:
            bound = binds.prepare(self.mounts_dir(job_id), *pending[1:], pending[0], self.own_dirs())
        elif pending is not None:  # the namespace thread is gone: links on the machine, as without root
            attach_as(pending[0], self.mounts_dir(job_id), pending[1], pending[2],
                      why="this server's namespace thread stopped, so replicas have no mount namespace of their own")

        def fallback() -> subprocess.Popen:  # no namespace thread, or it failed: the wrapper makes them itself
            return fork(self._argv(key, job_id, setup, run, env, namespaces, procs, repo, name), cwd or None)

        if spawner is not None:
            argv = self._argv(key, job_id, setup, run, env, False, procs, repo, name)
            if bound:  # no setuid program it starts gains rights: none can be fooled by what it binds
                argv = binds.NO_NEW_PRIVS + argv
                (self.run_dir(key) / NO_NEW_PRIVS_MARK).touch()  # what joins it later runs so too
            workdir = cwd or os.getcwd()  # this thread's: the namespace thread's own is /
            net = (address, self.bridge.host_end(key)) if self.bridge is not None and address else None
            needs = "network namespace" if self.bridge is not None else \
                "mount namespace (to bind its file_mounts)" if bound else ""
            own = self.own_dirs() if bound else ()  # (found once per process, importing the spec's code)

            def start() -> subprocess.Popen:  # on the namespace thread, inside the attempt's namespaces
                binds.bind_all(bound, own)
                return fork(argv, workdir)

            names = hosts or self.bridge is not None
            try:
                queued = spawner.submit(str(self._ensure_hosts(job_id)) if names else "", name if names else "",
                                        start, net)
            except NamespaceError as exc:
                return Spawning(None, fallback, exc, needs)
            return Spawning(queued, fallback, None, needs)
        return Spawning(None, fallback, None)

    def _container(self, key: str, job_id: int, container: Container, env: dict[str, str],
                   account: UnixAccount | None, log_path: Path | None, passthrough: tuple[str, ...] = ()) -> None:
        """The attempt's container files in its run directory (``corral.node.container``)."""
        binds = [str(self.job_dir(job_id)), env.get("CORRAL_CHECKPOINT_DIR", "")]
        self.job_dir(job_id).mkdir(parents=True, exist_ok=True)
        try:
            skipped = containers.prepare(self.run_dir(key), container, scope=self.trees.scope, key=key,
                                         job_id=job_id, env=env, hosts_file=str(self._ensure_hosts(job_id)),
                                         hostname=_hostname(env), binds=binds, account=account,
                                         locks=self.runs_dir.parent / "images", passthrough=passthrough,
                                         marks=self.job_dir(job_id), lifeline=True)
        except containers.ContainerError as exc:
            raise OSError(str(exc)) from None
        if skipped and log_path is not None:
            with open(log_path, "a") as log:
                log.write(f"corral: not passed into the container (a NUL in its value, or not a variable name): "
                          f"{', '.join(skipped)}\n")

    def write_env_file(self, key: str, env: dict[str, str], owner: UnixAccount | None = None) -> Path:
        """The job's environment as the account's shell reads it (NUL-separated NAME=value), in
        the attempt's run directory, readable by its reader alone (root, or ``owner``)."""
        path = self.run_dir(key) / "env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
            os.write(fd, b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items() if k != RUN_AS_VAR))
        finally:
            os.close(fd)
        return path

    def server_side_env(self, key: str, env: dict[str, str], account: UnixAccount,
                        owner: UnixAccount | None = None) -> dict[str, str]:
        """What a process of the server's rights gets when it starts another account's replica:
        nothing of the job's (its variables go through ``write_env_file``)."""
        path = self.write_env_file(key, env, owner)
        return {"PATH": SAFE_PATH, "LANG": "C.UTF-8", ATTEMPT_VAR: attempt_mark(self.trees.scope, key),
                RUN_AS_VAR: env.get(RUN_AS_VAR, ""),
                ENV_FILE_VAR: str(path), STOP_SIGNAL_VAR: env.get(STOP_SIGNAL_VAR, "")}

    def _namespace_spawner(self) -> NamespaceSpawner | None:
        with self._spawner_lock:
            if self._spawner is None and not self._spawner_tried:
                self._spawner_tried = True
                self._spawner = NamespaceSpawner.create(self.bridge, self._spawn_threads)
            if self._spawner is not None and self._spawner.broken is not None:
                return None
            return self._spawner

    def close(self) -> None:
        """Stop the namespace thread, if one was started, and the cgroup helper."""
        with self._spawner_lock:
            if self._spawner is not None:
                self._spawner.close()
                self._spawner = None
        self.trees.close()

    def exit_code(self, key: str) -> int | None:
        try:  # (the job's account may write the directory: ``runfiles``)
            return int((read_small(self.run_dir(key) / EXIT_FILE) or "").strip())
        except ValueError:
            return None

    def no_new_privs(self, key: str) -> bool:
        """The attempt runs with no_new_privs (it binds file_mounts): so must what joins it
        (``corral exec``, ``corral shell``, exec probes)."""
        return (self.run_dir(key) / NO_NEW_PRIVS_MARK).exists()

    def started_pid(self, key: str) -> int | None:
        """The wrapper's pid if it recorded that it started."""
        try:
            return int((read_small(self.run_dir(key) / STARTED_FILE) or "").strip())
        except ValueError:
            return None

    def end_tree(self, key: str, pid: int | None, thorough: bool = False) -> list[int]:
        """End whatever is left of the attempt (stragglers, detached children), like Slurm
        ends a step; returns pids that could not be killed. ``thorough`` (at adoption)
        also finds processes by the attempt's key in their environment."""
        if pid:
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        containers.remove(self.run_dir(key))  # the engine's client is gone; its container is not
        containers.remove_steps(self.run_dir(key), key)  # nor those of its batch script's steps
        return self.trees.kill(key, thorough=thorough)

    def forget(self, key: str) -> None:
        shutil.rmtree(self.run_dir(key), ignore_errors=True)

    # -- discovery files --------------------------------------------------------------------
    def job_dir(self, job_id: int) -> Path:
        return self.runtime_dir / str(job_id)

    def hosts_file(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "hosts"

    def _ensure_hosts(self, job_id: int) -> Path:
        path = self.hosts_file(job_id)
        if not path.exists():
            self.write_hosts(job_id, "")
        return path

    def write_hosts(self, job_id: int, names: str) -> None:
        """The machine's own hosts plus the job's names, rewritten in place: a bind mount
        holds the inode, so a rename would leave running attempts reading the old file."""
        try:
            system = Path("/etc/hosts").read_text()
        except OSError:
            system = "127.0.0.1\tlocalhost\n"
        text = (system.rstrip("\n") + "\n" + names).encode()
        path = self.hosts_file(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.fchmod(fd, 0o644)  # read by the replica's processes, whatever the server's umask
        try:
            os.write(fd, text)
            os.ftruncate(fd, len(text))
        finally:
            os.close(fd)

    def attempt_env(self, job_id: int, pythonpath: str | None) -> dict[str, str]:
        """Where an attempt on this node finds the job's names and peers, and how Python in it
        resolves them (the injected resolver first on its path)."""
        from corral.runtime.discovery import RESOLVER_DIR

        directory = self.job_dir(job_id)
        return {"CORRAL_HOSTS_FILE": str(directory / "hosts"), "CORRAL_PEERS_FILE": str(directory / "peers.json"),
                "CORRAL_NAMES": self.hosts_mode,
                "PYTHONPATH": str(RESOLVER_DIR) + (os.pathsep + pythonpath if pythonpath else "")}

    def publish(self, job_id: int, hosts: str, peers: str) -> None:
        directory = self.job_dir(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".peers.json.{os.getpid()}.tmp"
        tmp.write_text(peers)
        os.replace(tmp, directory / "peers.json")
        self.write_hosts(job_id, hosts)

    def repo_dir(self, job_id: int, url: str, ref: str | None) -> Path:
        """Where a job's git workdir is cloned on this node (on disk, beside the runs)."""
        digest = hashlib.sha1(f"{url}\0{ref or ''}".encode()).hexdigest()[:12]
        return self.runs_dir.parent / "workdirs" / str(job_id) / digest

    def mounts_dir(self, job_id: int) -> Path:
        """The record of what the job's ``file_mounts`` made on this node (``node.mounts``)."""
        return self.runs_dir.parent / "mounts" / str(job_id)

    def own_dirs(self) -> tuple[str, ...]:
        """Where this runner keeps what its wrappers (root) read and write: no mount may shadow it."""
        from corral.spec.mounts import code_dirs

        return tuple(dict.fromkeys([*(os.path.realpath(p) for p in (self.runs_dir.parent, self.runtime_dir)),
                                    *code_dirs()]))

    def cleanup_job(self, job_id: int) -> None:
        if self.binds:  # its mount points on the machine, where no other job uses them
            binds.release(self.mounts_dir(job_id))
        detach_as_owner(self.mounts_dir(job_id))
        self.trees.forget_job(job_id)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
        shutil.rmtree(self.runs_dir.parent / "workdirs" / str(job_id), ignore_errors=True)

    # -- probes and logs ----------------------------------------------------------------------
    def exec_probe(self, command: str, env: dict[str, str], cwd: str | None, timeout: float,
                   user_env: dict[str, str] | None = None) -> tuple[bool, str]:
        """Run ``command`` with ``env``; with ``user_env`` (a probe of another account's replica)
        the command starts with nothing of the job's and finds its variables in a private
        file named by ``CORRAL_ENV_FILE``, read past the account switch."""
        path = None
        if user_env is not None:
            fd, path = tempfile.mkstemp(dir=self.runs_dir, prefix=".probe-env-")  # 0600, the server's
            with os.fdopen(fd, "wb") as out:
                out.write(b"".join(f"{k}={v}".encode() + b"\0" for k, v in user_env.items()))
            env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", ENV_FILE_VAR: path}
        try:
            done = subprocess.run(["bash", "-c", command], env=env, cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:g}s"
        except OSError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            if path is not None:
                os.unlink(path)
        return done.returncode == 0, f"exit code {done.returncode}"

    @staticmethod
    def read_log(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(limit)
        except OSError:
            return b""
