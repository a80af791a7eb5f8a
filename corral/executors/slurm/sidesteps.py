"""Small steps beside a replica's: ``srun --overlap`` steps in the replica's allocation, on
its node, taking nothing from it (no GPUs, 16 MB), run as the allocation's account. Three
things are done that way because only a process on the node can do them well: send a stop
signal to the replica's process group (``scancel --signal`` would make slurmstepd log a cancel
into the replica's log and record the step CANCELLED, though the replica may end well on
it), end what a killed step left behind (a process that called setsid escapes Slurm's
proctrack), and run an exec probe where the replica runs. The process of a ``corral exec`` or
``corral shell`` is such a step too, with the caller's terminal (``srun --pty``). Also here: a
Slurm call retried while the controller is busy for a moment."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from corral.executors.slurm.allocations import Allocations
from corral.executors.slurm.cli import SlurmCli, SlurmError
from corral.node.proctree import ATTEMPT_VAR, REAP, attempt_mark

# the attempt's container, named in the file "$2" (engine, then name), removed on its node
UNBOX = ('if [ -n "$2" ] && [ -r "$2" ]; then { read -r e; read -r n; } < "$2"; '
         '"$e" rm --force --time 0 --ignore "$n" >/dev/null 2>&1; fi')
from corral.node.runner import LOAD_ENV, SAFE_PATH
from corral.node.terminal import ENTER_OWN, Terminal, env_bytes

log = logging.getLogger("corral.srun")

# the attempt's process group, if that pid is still its wrapper's (its key in its environment),
# and every process in its container (named in the file "$4"): the engine's init passes a
# signal to the run's shell alone (``corral.node.container.signal_all``)
SIGNAL_GROUP = ('grep -qzxF "CORRAL_ATTEMPT=$2" "/proc/$1/environ" 2>/dev/null || exit 3; '
                '{ kill -s "$3" -- "-$1" 2>/dev/null || kill -s "$3" "$1"; } && '
                'if [ -n "$4" ] && [ -r "$4" ]; then { read -r e; read -r n; } < "$4"; '
                '"$e" exec "$n" /bin/sh -c "kill -s $3 -1" >/dev/null 2>&1; true; fi')


# A shell step, as the allocation's account: the job's variables from the file "$1" (the
# account's alone, removed once read), then, when the replica's wrapper (pid in "$3", its key
# "$2" in its environment) is on this node, its step's Slurm variables and GPUs, its
# directory, and (a step of root's, where the wrapper made them) its mount and UTS namespaces.
SHELL_STEP = 'ENTER_=$CORRAL_ENTER; unset CORRAL_ENTER; ' + LOAD_ENV.replace("<&4; exec 4<&-", '< "$1"') + r"""rm -f -- "$1"
k=$2 p=$(cat "$3" 2>/dev/null); d=$4; shift 4
if [ -n "$p" ] && grep -qzxF "CORRAL_ATTEMPT=$k" "/proc/$p/environ" 2>/dev/null; then
  while IFS= read -r -d "" kv; do
    case $kv in SLURM_*=*|CUDA_VISIBLE_DEVICES=*|GPU_DEVICE_ORDINAL=*|ROCR_VISIBLE_DEVICES=*) export -- "$kv";; esac
  done < "/proc/$p/environ"
  d=$(readlink "/proc/$p/cwd" 2>/dev/null || printf '%s' "$d")
  if [ "$(id -u)" = 0 ] && [ "$(readlink /proc/$p/ns/mnt)" != "$(readlink /proc/$$/ns/mnt)" ] && command -v nsenter >/dev/null; then
    exec nsenter -t "$p" -m -u -- bash --noprofile --norc -c "$ENTER_" corral-shell "$d" "$@"
  fi
fi
exec bash --noprofile --norc -c "$ENTER_" corral-shell "$d" "$@"
"""
# inside the attempt's container, by the engine that runs it: the container's own world
BOXED_STEP = 'unset CORRAL_ENTER; rm -f -- "$1"; shift 4; exec "$@"'


# what srun says of its own when the step's task ends badly, even with --quiet: the caller
# gets the exit code itself (as ``kubectl exec`` and ``ssh`` say nothing of it)
_SRUN_END = re.compile(rb"srun: error: [^:\n]+: task \d+: (?:Exited with exit code \d+|Killed|Terminated|"
                       rb"[A-Za-z ]+)\r?\n")


class SrunTerminal(Terminal):
    """A shell step's srun client: its output, less srun's own line about how the task ended."""

    def read(self) -> tuple[int, bytes]:
        while True:
            kind, data = super().read()
            if kind == 0 or b"srun: error: " not in data:
                return kind, data
            data = _SRUN_END.sub(b"", data)
            if data:
                return kind, data


def fail(message: str):
    raise SlurmError(message)


def retrying(call: Callable, tries: int = 3, quiet: bool = False):
    """A Slurm call tried again on failure (a controller busy for a moment); the last error
    is raised (or, ``quiet``, logged)."""
    for attempt in range(tries):
        try:
            return call()
        except SlurmError as exc:
            if attempt == tries - 1:
                if quiet:
                    log.warning("Slurm call failed %d times: %s", tries, exc)
                    return None
                raise
            time.sleep(0.5 * (attempt + 1))


class SideSteps:
    def __init__(self, cli: SlurmCli, allocations: Allocations, scope: str, base_env: dict[str, str]):
        self.cli, self.allocations, self.scope, self.base_env = cli, allocations, scope, base_env

    def _argv(self, slurm_id: str, host: str, name: str, script: str, *args: str) -> list[str]:
        return ["srun", f"--jobid={slurm_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                "--gres=none", "--mem=16M", "--quiet", f"--job-name={name}",
                *self.allocations.step_identity(slurm_id), "bash", "-c", script, *args]

    def signal_group(self, slurm_id: str, host: str, pid: int | None, key: str, step_id: str, name: str,
                     boxed: str = "") -> None:
        """Send signal ``name`` to the attempt's process group on ``host`` (and, ``boxed`` naming
        its container, every process in that), as the local executor does; where that step
        cannot run, ``scancel --signal`` the step."""
        if pid and host:
            argv = self._argv(slurm_id, host, f"corral-{self.scope}-signal", SIGNAL_GROUP, "corral-signal",
                              str(pid), attempt_mark(self.scope, key), name, boxed)
            try:
                done = subprocess.run(argv, env={**self.base_env, **self.cli.conf}, capture_output=True, text=True,
                                      timeout=30, stdin=subprocess.DEVNULL)
                if done.returncode == 0:
                    return
                log.info("could not signal %s from a step (%s); through scancel", key,
                         (done.stderr or done.stdout).strip()[-200:])
            except (OSError, subprocess.SubprocessError) as exc:
                log.info("could not signal %s from a step (%s); through scancel", key, exc)
        retrying(lambda: self.cli.cancel(step_id, signal=name) or fail("scancel failed"), quiet=True)

    def reap(self, slurm_id: str, host: str, key: str, boxed: str = "") -> None:
        """Kill every process carrying the attempt's key on ``host``: Slurm kills the processes
        its proctrack follows, and with proctrack/linuxproc (or pgid) one that called setsid is
        not among them; if it holds the step's output the step never ends. ``boxed``: the file
        naming the attempt's container (engine, name), ended there too (its engine's monitor
        is no process of the step's)."""
        argv = self._argv(slurm_id, host, f"corral-{self.scope}-reap", REAP + 'corral_reap "$1"; rc=$?; ' + UNBOX + '; exit $rc',
                          "corral-reap", attempt_mark(self.scope, key), boxed)
        try:
            done = subprocess.run(argv, env={**self.base_env, **self.cli.conf}, capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("could not end what %s left on %s: %s", key, host, exc)
            return
        if done.returncode != 0:
            log.warning("processes of %s on %s survived SIGKILL: %s", key, host,
                        (done.stderr or done.stdout).strip()[-300:])

    def probe(self, slurm_id: str, host: str, command: str, env: dict[str, str], cwd: str | None,
              timeout: float, run_dir: Path) -> tuple[bool, str]:
        """An exec probe run where the replica runs: (passed, what it said). In another
        account's allocation root's srun starts it with nothing of the job's (BASH_ENV, PATH
        or LD_PRELOAD there would run as root); the probe's shell, the account's, reads the
        variables from a file in the attempt's run directory only that account may read."""
        owner = self.allocations.step_owner(slurm_id)
        if owner is None:
            return self._probe(self._argv(slurm_id, host, "corral-probe", command), env, cwd, timeout)
        fd, path = tempfile.mkstemp(dir=run_dir, prefix=".probe-env-")
        try:
            os.fchown(fd, *owner)
            with os.fdopen(fd, "wb") as out:
                out.write(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
            script = LOAD_ENV.replace("<&4; exec 4<&-", '< "$2"') + 'eval "$1"'
            argv = self._argv(slurm_id, host, "corral-probe", script, "corral-probe", command, path)
            return self._probe(argv, {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}, cwd, timeout)
        finally:
            os.unlink(path)

    def shell(self, slurm_id: str, host: str, key: str, run_dir: Path, request, boxed: list[str] | None) -> Terminal:  # noqa: ANN001 - a ShellRequest
        """A ``srun --overlap`` step on the replica's node (with ``--pty`` for a terminal) that
        enters its world (``SHELL_STEP``), or its container (``boxed``: the engine's exec), as
        the allocation's account. In another account's allocation root's srun carries nothing
        of the job's: the step reads its variables from a file only that account may read."""
        owner = self.allocations.step_owner(slurm_id)
        env = {**(request.run_as.env() if request.run_as else {}), **request.env,
               ATTEMPT_VAR: attempt_mark(self.scope, key)}
        fd, path = tempfile.mkstemp(dir=run_dir, prefix=".shell-env-")
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            with os.fdopen(fd, "wb") as out:
                out.write(env_bytes(env))
            script = SHELL_STEP if boxed is None else BOXED_STEP
            argv = ["srun", f"--jobid={slurm_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                    # the job's memory on the node, as the replica's: a shell's programs are the job's
                    "--gres=none", "--mem=0", "--quiet", "--disable-status", f"--job-name=corral-{self.scope}-shell",
                    *self.allocations.step_identity(slurm_id), *(["--pty"] if request.tty else []),
                    "bash", "--noprofile", "--norc", "-c", script, "corral-shell", path, attempt_mark(self.scope, key),
                    str(run_dir / "started"), request.cwd or "/", *(boxed or request.argv)]
            client = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "CORRAL_ENTER": ENTER_OWN, **self.cli.conf,
                      **({"TERM": request.env["TERM"]} if "TERM" in request.env else {})}
            return SrunTerminal(argv, client, request.tty, request.rows, request.cols,
                                cleanup=lambda: Path(path).unlink(missing_ok=True))
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise

    def _probe(self, argv: list[str], env: dict[str, str], cwd: str | None, timeout: float) -> tuple[bool, str]:
        try:
            done = subprocess.run(argv, env={**env, **self.cli.conf},
                                  cwd=cwd if cwd and os.path.isdir(cwd) else None, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:g}s"
        except OSError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return done.returncode == 0, f"exit code {done.returncode}"
