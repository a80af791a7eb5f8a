"""Pyxis's options on an ``srun`` line of a batch script run on a Slurm infra
(``infra: slurm``): the same script runs on a Slurm site with Pyxis as on one without.

The batch script's ``srun`` is Slurm's own, reached through a small shell command that hands
a line to this module only when a word starts with ``--container-``
(``corral.runtime.batchenv.SLURM_SRUN``). Here:

* where the site has Pyxis (its ``srun --help`` lists ``--container-image``), Slurm's srun
  gets the line untouched;
* elsewhere Pyxis's options are taken out and Slurm's srun runs the step with every other
  option as written (node and task counts, ``-w``, ``--export``, ``-l`` …); each of its tasks
  runs ``task-container`` here, which runs the command in its container on the node's engine
  (``corral.node.stepcontainer``), with the task's own Slurm variables, as the job's account.

Which of srun's options take a value (so that the word after one is not taken for the
command) is read from the site's own ``srun --help``. What a task needs to run its container
(the site's engine and run options, the job's files) travels in its command line, so a step
given ``--export=NONE`` still has it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from corral.spec import pyxis

# what a step's task needs from the batch script's environment to run its container
CONTEXT = ("CORRAL_CONTAINER_ENGINE", "CORRAL_CONTAINER_OPTIONS", "CORRAL_HOSTS_FILE", "CORRAL_CHECKPOINT_DIR",
           "CORRAL_LAUNCH_KEY", "CORRAL_JOB_ID", "CORRAL_NAMED_CONTAINERS")
# srun options that take a value though its --help shows none (Slurm 22.05)
_VALUED = {"container", "jobid", "mpi", "uid", "gid"}
_HELP = re.compile(r"^\s+(?:-([A-Za-z]),\s+)?--([A-Za-z][\w-]*)(\[?=)?")


def real_srun(env: dict[str, str], here: str) -> str | None:
    """Slurm's own srun: the first on PATH that is not corral's (in ``here``)."""
    for directory in (env.get("PATH") or "").split(os.pathsep):
        path = os.path.join(directory, "srun")
        if directory and os.path.realpath(directory) != os.path.realpath(here) and os.access(path, os.X_OK):
            return path
    return None


def valued_options(help_text: str) -> tuple[set[str], set[str]]:
    """(long names, short letters) of srun's options that take a value, from its ``--help``
    (``--nodes=N``; not those whose value is optional, ``--exclusive[=user]``)."""
    long, short = set(_VALUED), set()
    for line in help_text.splitlines():
        match = _HELP.match(line)
        if match and match.group(3) == "=":
            long.add(match.group(2))
            if match.group(1):
                short.add(match.group(1))
    return long, short


def split(argv: list[str], help_text: str) -> tuple[dict[str, str | bool], list[str], list[str]]:
    """(Pyxis's options, srun's own options, the command) of an srun line."""
    long, short = valued_options(help_text)
    given: dict[str, str | bool] = {}
    own: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return given, own, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return given, own, argv[i:]
        name, sep, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if name in pyxis.OPTIONS:
            if pyxis.OPTIONS[name] and not sep:
                if i + 1 >= len(argv):
                    raise pyxis.PyxisError(f"--{name}", "needs a value")
                i += 1
                value = argv[i]
            elif not pyxis.OPTIONS[name] and sep:
                raise pyxis.PyxisError(f"--{name}", "takes no value")
            given[name] = value if pyxis.OPTIONS[name] else True
        else:
            own.append(word)
            takes = (name in long and not sep) if name else (len(word) == 2 and word[1] in short)
            if takes and i + 1 < len(argv):
                i += 1
                own.append(argv[i])
        i += 1
    return given, own, []


def plan(argv: list[str], env: dict[str, str], here: str) -> list[str]:
    """The argv this srun line runs: Slurm's own srun with the line as written where the site
    has Pyxis (or the line gives none of its options), else with Pyxis's options taken out and
    each task's command run in its container here. PyxisError naming a bad option;
    FileNotFoundError without a Slurm srun."""
    srun = real_srun(env, here)
    if srun is None:
        raise FileNotFoundError("srun: command not found (no Slurm srun on PATH)")
    help_text = subprocess.run([srun, "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=env).stdout
    if pyxis.pass_through(help_text):
        return [srun, *argv]
    given, own, command = split(argv, help_text)
    if not given:
        return [srun, *argv]
    container = pyxis.container_of(given)
    if not command:
        raise pyxis.PyxisError(f"--{next(iter(given))}", "srun has no command to run in the container")
    context = {name: env[name] for name in CONTEXT if name in env}
    blob = json.dumps({"container": json.loads(container.to_json()), "context": context}, sort_keys=True)
    runner = str(Path(__file__).with_name("srun.py").resolve())
    return [srun, *own, sys.executable, runner, "task-container", blob, *command]


def main(argv: list[str]) -> int:
    """``srun ARGS`` on a Slurm infra, from ``SLURM_SRUN``: execs Slurm's srun."""
    env = dict(os.environ)
    here = env.get("CORRAL_SLURM_SHIMS") or "/nonexistent"  # corral's srun's directory (``batchenv``)
    try:
        final = plan(argv, env, here)
    except pyxis.PyxisError as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return 127
    os.execv(final[0], final)
    return 127  # not reached


def task(argv: list[str]) -> int:
    """``task-container BLOB CMD…``: one task of Slurm's step, its command in its container."""
    from corral.node import stepcontainer
    from corral.spec.pyxis import StepContainer

    if len(argv) < 2:
        print("srun: error: task-container needs its container and a command", file=sys.stderr)
        return 2
    blob = json.loads(argv[0])
    container = StepContainer.from_json(json.dumps(blob["container"]))
    env = dict(os.environ)
    for name, value in blob["context"].items():
        env.setdefault(name, value)
    key = stepcontainer.task_key(env, env.get("SLURM_STEP_ID", "0"), env.get("SLURM_PROCID", "0"))
    return stepcontainer.run(container, key, env, argv[1:], who="srun")
