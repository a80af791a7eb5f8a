"""SkyPilot's ``file_mounts: {REMOTE_PATH: SOURCE}`` as corral accepts it.

SOURCE is a file or a directory on the machine the job was submitted from (a relative one
resolves against the submit directory, as a relative ``workdir`` does; ``~`` is the
submitter's home); REMOTE_PATH is where every replica sees it: absolute, or ``~/…`` (the home
of the account the replica runs as, resolved on its node). What corral cannot honour is
refused at submission with a sentence, never dropped: cloud buckets (``s3://…`` or the
dictionary form SkyPilot uses for storage), relative or ``..`` remote paths, and system
directories (or corral's own) a job must never shadow. The stored form has absolute sources, and validates
again to itself. How a mount appears on a node is ``corral.node.mounts``."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from corral.spec.source import shown

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Directories whose contents the system itself needs: a job may not put anything there, nor
# over them. A path below another (``/data``, ``/opt/x``, ``/var/tmp/x``, ``/tmp/x``) is the
# job's to use.
PSEUDO_DIRS = ("/proc", "/sys", "/dev")  # never a source: what they show depends on who reads them
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/boot", "/run", "/var/run")
_LIB = re.compile(r"^/lib[^/]*(/|$)")  # /lib, /lib64, /libx32 …
MAX_MOUNTS = 64


def _remote(value: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError("a remote path is absolute (/data) or in the replica's home (~/data)")
    if "\x00" in text:
        raise ValueError("a remote path cannot hold a NUL byte")
    if ":" in text or "," in text:  # a container engine would read volume options after them
        raise ValueError(f"{shown(value)} holds ':' or ',': a remote path may not (a container's bind would read "
                         "options there)")
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        raise ValueError(f"{shown(value)} is relative: a remote path is absolute (/data) or in the replica's "
                         "home (~/data)")
    if ".." in text.split("/"):
        raise ValueError(f"{shown(value)} holds '..': name the remote path directly")
    if text == "~":
        raise ValueError("~ is the replica's home itself: mount into it (~/data), not over it")
    normal = ("~/" + os.path.normpath(text[2:]).lstrip("/")) if text.startswith("~/") else os.path.normpath(text)
    normal = "/" + normal.lstrip("/") if normal.startswith("/") else normal  # normpath keeps a leading //
    if normal in ("~/.", "~/"):
        raise ValueError("~ is the replica's home itself: mount into it (~/data), not over it")
    why = shadows(normal)
    if why:
        raise ValueError(why)
    return normal


def shadows(path: str, own: tuple[str, ...] = ()) -> str | None:
    """Why a job may not mount at ``path`` (absolute, normal), or None: a system path, or one
    at, in or above a directory of corral's own (``own``: its home, its runtime directory),
    where the replica's wrapper, still root, reads and writes after the mounts are made."""
    if path == "/" or any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS) or _LIB.match(path):
        return f"{path} is a system path a job may not shadow: mount under another directory (/data, /mnt/…, ~/…)"
    for mine in own:
        if path == mine or path.startswith(mine.rstrip("/") + "/") or mine.startswith(path.rstrip("/") + "/"):
            return (f"{path} would shadow corral's own directory {mine} (its files, or the code its server runs as "
                    "root): mount under another directory")
    return None


@functools.cache  # (0.6 ms a call, and every submission asks: what it reads is fixed at start-up)
def code_dirs() -> tuple[str, ...]:
    """Where this process's Python and corral's own code are (its interpreter's prefix, its
    standard library and site-packages, the directory holding the ``corral`` package): the
    server's namespace thread runs Python after a replica's mounts are bound, so no mount may
    put files of a job's where an import (or a finalizer's) would read them as root."""
    import sys
    import sysconfig

    import corral

    paths = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(corral.__file__)))]
    paths += [sysconfig.get_paths().get(k) or "" for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += [p for p in sys.path if p.startswith("/")]
    out = (os.path.realpath(p) for p in paths if p and os.path.isdir(p))
    return tuple(dict.fromkeys(p for p in out if p != "/"))


def corral_dirs() -> tuple[str, ...]:
    """This server's own directories (its home and runtime directory), which no mount may shadow."""
    from corral.settings import Settings

    # (the runtime directory's default is under /dev/shm or the home: refused either way)
    dirs = [str(Settings.from_env().home), os.environ.get("CORRAL_RUNTIME_DIR") or ""]
    return tuple(dict.fromkeys([*(os.path.realpath(p) for p in dirs if p), *code_dirs()]))


def _source(value: Any) -> Any:
    if isinstance(value, dict):
        where = value.get("source") or value.get("name")
        raise ValueError("corral cannot mount buckets or SkyPilot storage"
                         + (f" ({shown(str(where))})" if where else "")
                         + ": the source is a file or directory on the machine you submit from; "
                         "copy the bucket's data there, or read it from the bucket in setup or run")
    if not isinstance(value, str):
        raise ValueError("a source is a file or directory path on the machine you submit from")
    text = value.strip()
    if _SCHEME.match(text):
        raise ValueError(f"{shown(text)} is a cloud bucket or URL, and corral cannot mount buckets: the source is "
                         "a file or directory on the machine you submit from (copy the data there, or fetch it "
                         "in setup or run)")
    if not text or "\x00" in text:
        raise ValueError("a source is a file or directory path on the machine you submit from")
    if ":" in text or "," in text:
        raise ValueError(f"{shown(text)} holds ':' or ',': a source may not (a container's bind would read "
                         "options there)")
    return text


RemotePath = Annotated[str, AfterValidator(_remote)]
SourcePath = Annotated[str, BeforeValidator(_source)]


def check_mounts(value: dict[str, str]) -> dict[str, str]:
    """At most ``MAX_MOUNTS``, and none inside another: a bind inside a bind writes its mount
    point into the outer source (the submitter's own directory), a link inside a link puts a
    link there, and a namespace's mounts cannot reach into another's source at all, so the one
    rule every infra can keep is to refuse it."""
    if len(value) > MAX_MOUNTS:
        raise ValueError(f"at most {MAX_MOUNTS} file_mounts per task")
    remotes = sorted(value)
    for outer in remotes:
        inner = next((r for r in remotes if r != outer and r.startswith(outer.rstrip("/") + "/")), None)
        if inner is not None:
            raise ValueError(f"{inner} is inside {outer}, another of the task's mounts: mount them at "
                             "sibling paths (what corral makes for the inner one would land in the outer "
                             "one's source, your own files)")
    return value


def resolve_sources(mounts: dict[str, str], base_dir: str | None, home: str | None,
                    own: tuple[str, ...] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """Each source made absolute against ``base_dir`` (``~``: ``home``) and checked to exist:
    (the mounts in their stored form, {remote: why a mount is refused}); a remote path that
    would shadow one of ``own`` (``corral_dirs``) is refused too."""
    out: dict[str, str] = {}
    problems: dict[str, str] = {}
    for remote, written in mounts.items():
        why = shadows(remote, own) if remote.startswith("/") else None
        if why:
            problems[remote] = why
            out[remote] = written
            continue
        text = written
        if text == "~" or text.startswith("~/"):
            text = (home or str(Path("~").expanduser())) + text[1:]
        if not text.startswith("/") and base_dir is None:
            problems[remote] = (f"{shown(written)} is relative, and the submission names no directory to resolve "
                                "it against (cwd)")
            out[remote] = written
            continue
        path = os.path.normpath(os.path.join(base_dir or "/", text))
        path = "/" + path.lstrip("/")
        out[remote] = path
        pseudo = next((d for d in PSEUDO_DIRS if path == d or path.startswith(d + "/")), None)
        if pseudo is not None:  # the kernel's views (of this process, of devices), not your files
            problems[remote] = (f"{path} is under {pseudo}, the kernel's own view of the machine, not a file or "
                                "directory of yours to mount")
        elif not os.path.lexists(path) or not os.path.exists(path):
            against = f" (resolved against the submit directory {base_dir})" if not text.startswith("/") else ""
            problems[remote] = f"{path} does not exist{against}: the source is a file or directory where you submit"
        elif not (os.path.isfile(path) or os.path.isdir(path)):
            problems[remote] = f"{path} is neither a file nor a directory"
    return out, problems


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
FILLED = ("file_mounts", "workdir")  # the fields ``sky launch`` fills variables in at load


def fill_variables(doc: Any, cli_env: dict[str, str] | None) -> Any:
    """A task's document with SkyPilot's ``${VAR}`` (or ``$VAR``) filled in its ``file_mounts``
    (remote paths and sources) and ``workdir`` from its ``envs``, ``--env`` winning, as ``sky
    launch`` fills them when it reads the file. A name neither sets stays as written (its path
    then fails to resolve, naming the field); ``secrets`` never fill one: they are for the
    job's commands alone, never written into a path. ``doc``: a ``corral.spec.source.Document``;
    the lines of the fields it changed follow them."""
    data = doc.data
    if not isinstance(data, dict) or not any(isinstance(data.get(f), (str, dict)) for f in FILLED):
        return doc
    envs = data.get("envs") if isinstance(data.get("envs"), dict) else {}
    values = {str(k): _scalar(v) for k, v in envs.items() if _scalar(v) is not None}
    values.update(cli_env or {})
    if not values:
        return doc

    def fill(text: str) -> str:
        return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)

    data, lines = dict(data), dict(doc.lines)
    if isinstance(data.get("workdir"), str):
        data["workdir"] = fill(data["workdir"])
    if isinstance(data.get("file_mounts"), dict):
        filled = {}
        for remote, source in data["file_mounts"].items():
            new = fill(remote) if isinstance(remote, str) else remote
            filled[new] = fill(source) if isinstance(source, str) else source
            if new != remote:  # its line (and those of anything under it) under its new name
                for path, line in doc.lines.items():
                    if path[:2] == ("file_mounts", remote):
                        lines[("file_mounts", new, *path[2:])] = line
        data["file_mounts"] = filled
    return replace(doc, data=data, lines=lines)


def _scalar(value: Any) -> str | None:
    """An ``envs`` value as its variable holds it (YAML reads ``13`` and ``true`` as numbers and
    booleans), or None for one without a value."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
