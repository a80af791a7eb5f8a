"""Pyxis's named containers (``--container-name=NAME``) where corral runs a step's containers
itself: a container's filesystem kept across the steps of one job, on each node, as Pyxis
keeps an enroot container, so what one step wrote or installed there is there for the next.

How: the first step that names it unpacks the image into a root filesystem (the engine's
``create`` and ``export``, as enroot unpacks an image into a directory), and every step that
names it on that node runs in that directory (``--rootfs``), each task in a container of its
own (its processes end with it) over the same files. A root filesystem carries none of its
image's configuration, so the image's environment, working directory and entrypoint are kept
beside it (``config.json``) and given to each run.

Where and whose: on disk beside the job's git workdirs in the server's home (``NAMED_VAR``,
which the Slurm nodes share with the server, as they share the job's other files; never the
runtime directory, which may be memory), one entry per node and name; that directory is
removed by the server when the job ends, however it ends (exit, failure, cancel, a time
limit), so a name is never seen by another job. It is
made by the step's own process, so its files are the job's account's, made with its rights
(another account's, under a root server, through its own rootless engine). Nobody else may
list it: its index (0600) maps names to directories named by a random token. A root job's are
closed to every other account (0700); another account's, run by its rootless engine, are
traversable (0711), because that engine's container root (a subordinate uid) must pass through
them to mount the root filesystem: their files are as private as those under a directory
others may pass through but not list, and the engine's command line names the directory."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Callable

from corral.node.container import HOST_ONLY

NAMED_VAR = "CORRAL_NAMED_CONTAINERS"  # where the job's named containers are kept (set at launch)
INDEX = "index"
CONFIG = "config.json"
ROOTFS = "rootfs"


class NamedError(Exception):
    """The named container cannot be used: the sentence says why (the step fails)."""


def base_dir(env: dict[str, str]) -> Path | None:
    """The job's named containers (None outside a job)."""
    return Path(env[NAMED_VAR]) if env.get(NAMED_VAR) else None


def ensure(env: dict[str, str], name: str, flag: str, image: str | None, engine: str,
           pull: Callable[[], str | None], options: tuple[str, ...] = ()) -> Path:
    """The directory of the job's container ``name`` on this node (its ``rootfs`` and image
    ``config.json``), made from ``image`` (after ``pull``, which returns what went wrong) if the
    job has none yet, as Pyxis's ``auto``; ``create`` asks for a new one, ``exec`` for one that
    exists. ``options``: the site's run options (its runtime). NamedError with the reason it
    cannot be used."""
    base = base_dir(env)
    node = env.get("SLURMD_NODENAME") or "node"
    if base is None:
        raise NamedError(f"--container-name={name}: outside a corral job there is no job to keep it for")
    try:
        base.mkdir(mode=0o711, parents=True, exist_ok=True)
        if base.stat().st_uid == os.geteuid():
            base.chmod(0o711)  # handed over private; a rootless engine's container root passes through it
        fd = os.open(base / INDEX, os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise NamedError(f"--container-name={name}: cannot keep it in {base}: {exc.strerror}") from None
    with os.fdopen(fd, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one step at a time makes a name; the others wait and reuse it
        handle.seek(0)
        known = {(n, m): d for n, m, d in (line.split("\t") for line in handle.read().splitlines()
                                           if line.count("\t") == 2)}
        if (node, name) in known:
            if flag == "create":
                raise NamedError(f"--container-name={name}:create: this job already has a container {name} on "
                                 f"node {node}")
            return base / known[(node, name)]
        if flag == "exec":
            raise NamedError(f"--container-name={name}:exec: this job has no container {name} on node {node} to "
                             "run in")
        if image is None:
            raise NamedError(f"--container-name={name}: this job has no container {name} on node {node} yet, and "
                             "the step gives no --container-image to make it from")
        said = pull()
        if said is not None:
            raise NamedError(f"--container-image: could not pull {image}: {said}")
        directory = base / secrets.token_hex(12)
        # a rootful engine (root's own jobs) needs nobody else to pass: closed, so that no other
        # account, learning the path from the engine's command line, reads or writes its files
        directory.mkdir(mode=0o700 if os.geteuid() == 0 else 0o711)
        try:
            _unpack(engine, image, directory, options)
        except NamedError:
            _remove_tree(directory)
            raise
        handle.write(f"{node}\t{name}\t{directory.name}\n")
        handle.flush()
        return directory


def _unpack(engine: str, image: str, directory: Path, options: tuple[str, ...]) -> None:
    """The image's files into ``directory/rootfs`` and its configuration into ``config.json``."""
    def run(*argv: str) -> str:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise NamedError(f"--container-image={image}: could not unpack it for a named container: "
                             f"{(done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1][:300]}")
        return done.stdout

    config = run(engine, "image", "inspect", "--format", "{{json .Config}}", image).strip() or "{}"
    (directory / CONFIG).write_text(config)
    made = run(engine, "create", *options, "--entrypoint=", image, "corral-unpack").strip()
    rootfs = directory / ROOTFS
    rootfs.mkdir(mode=0o755)
    try:
        export = subprocess.Popen([engine, "export", made], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "--numeric-owner", "-C", str(rootfs)], stdin=export.stdout,
                               capture_output=True, text=True)
        export.stdout.close()
        said = export.stderr.read().decode(errors="replace")
        if export.wait() != 0 or untar.returncode != 0:
            raise NamedError(f"--container-image={image}: could not unpack it for a named container: "
                             f"{(said or untar.stderr).strip()[-300:]}")
    finally:
        subprocess.run([engine, "rm", "--force", made], stdin=subprocess.DEVNULL, capture_output=True)


def _remove_tree(directory: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], capture_output=True)


def run_options(directory: Path, env: dict[str, str], kept: tuple[str, ...], workdir: str | None) -> list[str]:
    """What a run in the named container takes from its image's configuration (which its root
    filesystem does not carry): the image's variables where the task sets none (and those of
    the node's paths, ``PATH`` …, which a container takes from its image), unless
    ``--container-env`` keeps the task's; its working directory where the step gives none."""
    try:
        config = json.loads((directory / CONFIG).read_text()) or {}
    except (OSError, ValueError):
        config = {}
    out: list[str] = []
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        if key and key not in kept and (key in HOST_ONLY or key not in env):
            out += ["--env", f"{key}={value}"]
    if workdir is None and config.get("WorkingDir"):
        out += ["-w", config["WorkingDir"]]
    return out + ["--rootfs", str(directory / ROOTFS)]


def entrypoint(directory: Path) -> list[str]:
    """The image's entrypoint (run before the command with ``--container-entrypoint``)."""
    try:
        config = json.loads((directory / CONFIG).read_text()) or {}
    except (OSError, ValueError):
        return []
    return list(config.get("Entrypoint") or [])
