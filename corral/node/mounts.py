"""A job's ``file_mounts`` on the node its replicas run on: each appears at its remote path
for the replica's whole life, and what corral made for it goes when the job ends.

Where the node sees the source (this machine, Slurm nodes on a shared filesystem, Ray nodes
of one machine) the remote path becomes a symbolic link to it: nothing is copied, and a
replica reads the submitter's file as it is. Where it does not, the source arrives as a tar
archive (``archive``) and is unpacked once per job per node into the job's record directory,
under a lock so concurrent replicas of the job on one node copy it once; the remote path
then links to that copy.

Jobs of one account that link one remote path to one source on a node (a YAML launched twice,
the elements of an array) share the link: a small state file per remote path, in a directory
of the account's own (``_Users``), lists the jobs using it; the last one to end removes it,
with the directories made above it. A link to another source, or another account's, is never
shared: that job fails with a sentence, as for anything else already there.

On Slurm, a source the nodes may not see is copied into the job's record directory before the
step starts (``corral.node.staging``); ``attach`` and ``here`` take a complete copy of the
job's over whatever the node has at the source's path (a node's own /data/x is not the
submitter's); ``detach`` removes it with the record when the job ends.

A container binds the source where the node sees it, else that same copy (``here``; on
Slurm, the link ``seen_at`` that ``staging.stage`` makes to the one or the other). On the
local executor, where the server is root and may make namespaces, nothing is linked: each
replica binds its mounts in its own mount namespace (``corral.node.binds``); the links here
are for a server that is not root, a node that refuses namespaces, Slurm steps and Ray actors.

Everything here runs as the job's Unix account, never with the server's rights on its behalf:
the local and Slurm executors run this file's text as a program of that account (stdlib
only, so a bare ``python3 -I`` runs it in some 20 ms), the Ray actor (already of that account)
calls it in-process. A remote path the account may not create fails the replica's launch with
a sentence naming the mount; anything already at a remote path that corral did not make for
this job is never replaced. The record directory (one per job per node, the account's) lists
every link, directory and copy made, written before the link appears, so ``detach`` at the
job's end, also after a server restart, removes exactly those: a link only while it still
points where corral pointed it, a directory only while empty."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import pwd
import shutil
import socket
import sys
import tarfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

RECORD = "made.jsonl"
LOCK = "lock"
COPIES = "copies"
COMPLETE = ".complete"
SEEN = "at"  # in the record: a link per source to what the job's containers bind (``seen_at``)

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
WHY_VAR = "CORRAL_MOUNTS_WHY"  # why a mount is a link here (no mount namespace), for its refusals
Archive = Callable[[str], bytes]  # a source's contents as a tar archive (its top entry: the source's name)


class MountError(Exception):
    """A mount that cannot appear; the message is one sentence naming ``file_mounts.REMOTE``."""


def home_of_this_account() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir or "/"
    except KeyError:
        return os.environ.get("HOME") or "/"


def expand(remote: str, home: str) -> str:
    """A remote path as written (``/data``, ``~/data``) on this node: ``~`` is the replica's home."""
    return os.path.join(home, remote[2:]) if remote.startswith("~/") else remote


@contextmanager
def _locked(record_dir: Path) -> Iterator[None]:
    record_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(record_dir / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _records(record_dir: Path) -> list[dict]:
    try:
        text = (record_dir / RECORD).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: what it named was not made yet
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            out.append(entry)
    return out


def _record(record_dir: Path, **entry: str) -> None:
    with open(record_dir / RECORD, "a") as out:
        out.write(json.dumps({**entry, "host": socket.gethostname()}) + "\n")
        out.flush()
        os.fsync(out.fileno())


class _Users:
    """Who uses the link at one remote path on this node: the state file (target, the jobs'
    record directories, the directories made above it) of one account, under a lock. None of
    it exists where the account has no private directory for it: then nothing is shared."""

    def __init__(self, path: str) -> None:
        base = Path("/tmp") / f"corral-links-{os.getuid()}"  # (not TMPDIR: the same for every process of the account)
        self.file: Path | None = base / (hashlib.sha1(path.encode()).hexdigest()[:24] + ".json")
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        except OSError:
            self.file = None
            return
        info = os.lstat(base)
        if not os.path.isdir(base) or os.path.islink(base) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            self.file = None  # planted by someone else: shared with no one

    @contextmanager
    def held(self) -> Iterator[dict | None]:
        """The state (None: not sharable), written back when the block ends."""
        if self.file is None:
            yield None
            return
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(os.read(fd, 1 << 20) or b"{}")
            except ValueError:
                state = {}
            if not isinstance(state, dict):
                state = {}
            # a job whose record is gone ended (or its node was cleaned): it uses nothing
            state["users"] = [u for u in state.get("users", []) if isinstance(u, str) and os.path.isdir(u)]
            yield state
            data = json.dumps(state).encode() if state.get("users") else b""
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)


def copy_dir(record_dir: Path, source: str) -> Path:
    """Where a source's copy lives on this node (the link's target), one per source per job."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    return record_dir / COPIES / digest / (os.path.basename(source.rstrip("/")) or "root")


def _copy(record_dir: Path, source: str, archive: Archive | None, remote: str) -> str:
    """The source unpacked on this node, once per job (the caller holds the job's lock)."""
    target = copy_dir(record_dir, source)
    if target.parent.joinpath(COMPLETE).exists():
        return str(target)
    if archive is None:
        raise MountError(f"file_mounts.{remote}: {source} is not visible on this node ({socket.gethostname()}) and "
                         "nothing can copy it here: put it on a filesystem the nodes share")
    try:
        data = archive(source)
    except Exception as exc:  # the engine's transport: its words, in one sentence
        raise MountError(f"file_mounts.{remote}: {source} could not be copied to this node: {exc}") from None
    shutil.rmtree(target.parent, ignore_errors=True)  # a copy cut short earlier
    target.parent.mkdir(parents=True)
    _record(record_dir, kind="copy", path=str(target.parent))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        members = tar.getmembers()
        top = os.path.basename(source.rstrip("/")) or "root"
        for member in members:  # only what the archive says is the source: nothing outside it
            name = member.name.lstrip("./")
            outside = not (name == top or name.startswith(top + "/"))
            if outside or (member.issym() and os.path.isabs(member.linkname)) or member.islnk() or member.isdev():
                raise MountError(f"file_mounts.{remote}: the copy of {source} holds {member.name!r}, "
                                 "which is not part of it")
        if top != target.name:
            raise MountError(f"file_mounts.{remote}: the copy of {source} is not named {target.name}")
        tar.extractall(target.parent, members=members, filter="tar") if hasattr(tarfile, "data_filter") \
            else tar.extractall(target.parent, members=members)
    target.parent.joinpath(COMPLETE).touch()
    return str(target)


# Directories nested deeper are not copied: a copy (copytree, tar) recurses once per level,
# and os.walk did too, so a tree ~1000 levels deep was a RecursionError (an HTTP 500 at
# submission) where it must be a sentence. No real dataset nests anywhere near this.
MAX_DEPTH = 128


class TooDeep(OSError):
    """A source whose directories nest deeper than ``MAX_DEPTH``."""


def entries(source: str):  # noqa: ANN201 - an iterator of os.DirEntry
    """Every entry under the directory ``source`` (links not followed), walked with a stack,
    not recursion; a directory that cannot be read is passed over, as ``os.walk`` does.
    Raises ``TooDeep`` past ``MAX_DEPTH`` levels."""
    stack = [(source, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            with os.scandir(path) as listing:
                found = list(listing)
        except OSError:
            continue
        for entry in found:
            yield entry
            try:
                inner = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if inner:
                if depth + 1 >= MAX_DEPTH:
                    raise TooDeep(f"{source} nests directories over {MAX_DEPTH} levels deep, deeper than corral "
                                  "copies: pack it (tar) or put it on a filesystem the nodes share")
                stack.append((entry.path, depth + 1))


def size_of(source: str, stop: int) -> int:
    """The bytes of a file, or of everything under a directory (links not followed); counting
    stops past ``stop``. Raises ``TooDeep`` for a tree nested deeper than corral copies."""
    if not os.path.isdir(source) or os.path.islink(source):
        return os.lstat(source).st_size
    total = 0
    for entry in entries(source):
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        if total > stop:
            return total
    return total


TOO_LARGE = 3  # what ``pack_as`` exits with for a source over its limit


def pack_as(account: tuple[int, int, tuple[int, ...]] | None, source: str, limit: int) -> bytes | None:
    """``pack`` of a source no larger than ``limit`` bytes (None when it is larger), read with
    the rights of ``account`` (uid, gid, groups: the job's, where this process is root for
    others) or this process's own. Raises OSError with the reader's words."""
    if account is None:
        return None if size_of(source, limit) > limit else pack(source)
    import subprocess

    uid, gid, groups = account
    done = subprocess.run(_program("pack", source, str(limit)), user=uid, group=gid, extra_groups=list(groups),
                          cwd="/", env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"}, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=600)
    if done.returncode == TOO_LARGE:
        return None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(said[-1].removeprefix("corral: ") if said else f"packing failed (exit {done.returncode})")
    return done.stdout


def pack(source: str) -> bytes:
    """A source as ``_copy`` unpacks it (read by the caller's own rights: run it as the job's account)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(source, arcname=os.path.basename(source.rstrip("/")) or "root")
    return out.getvalue()


def lacking(record_dir: Path, mounts: list[tuple[str, str]], sees: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The sources this node neither sees nor holds a copy of for the job: what must be sent."""
    return sorted({source for _, source in mounts if not sees(source)
                   and not staged(record_dir, source)})


def seen_at(record_dir: Path, source: str) -> Path:
    """A link, made by ``staging.stage``, to what the job's replicas see of ``source``: its staged copy,
    else the source's own path (each node resolves it there). A Slurm step's container binds
    it, so the container of a node that does not see the source gets the copy."""
    return record_dir / SEEN / hashlib.sha1(source.encode()).hexdigest()[:16]


def staged(record_dir: Path, source: str) -> bool:
    """Whether the job holds a complete copy of ``source`` (staged on the submitting machine,
    or unpacked on this node)."""
    return copy_dir(record_dir, source).parent.joinpath(COMPLETE).exists()


def _target(record_dir: Path, source: str, archive: Archive | None, remote: str, sees: Callable[[str], bool]) -> str:
    """What the remote path shows on this node: the job's complete copy where there is one (the
    submitter's file, whatever the node has at that path), else the source where the node
    sees it, else its copy, unpacked now (the caller holds the job's lock)."""
    if not staged(record_dir, source) and sees(source):
        return source
    return _copy(record_dir, source, archive, remote)


def here(record_dir: Path, mounts: list[tuple[str, str]], *, sees: Callable[[str], bool] = os.path.exists,
         archive: Archive | None = None) -> list[tuple[str, str]]:
    """Each ``(remote, source)`` with the source as this node has it: the job's complete copy
    where there is one, else itself where the node sees it, else its copy for the job (unpacked
    once, recorded for ``detach``). A container binds these. Raises ``MountError`` naming the
    mount."""
    with _locked(record_dir):
        return [(remote, _target(record_dir, source, archive, remote, sees)) for remote, source in mounts]


def attach(record_dir: Path, mounts: list[tuple[str, str]], home: str, *,
           sees: Callable[[str], bool] = os.path.exists, archive: Archive | None = None, why: str = "") -> list[str]:
    """Make every ``(remote as written, absolute source)`` appear at its remote path on this
    node, as this process's account (linked to the job's complete copy where there is one,
    else to the source where the node sees it); returns the paths linked. Idempotent for the job: a link
    corral already made for it (another replica's, an earlier attempt's) is kept. Raises
    ``MountError`` naming the mount (with ``why`` the replica has no mount namespace, if given)."""
    made = []
    me = str(record_dir)
    with _locked(record_dir):
        ours = {(e["path"], e.get("target")) for e in _records(record_dir) if e.get("kind") in ("link", "shared")}
        for remote, source in mounts:
            path = expand(remote, home)
            target = _target(record_dir, source, archive, remote, sees)
            with _Users(path).held() as users:
                if os.path.lexists(path):
                    if os.path.islink(path) and os.readlink(path) == target and (path, target) in ours:
                        made.append(path)
                        continue
                    if users is not None and users.get("users") and users.get("target") == target \
                            and os.path.islink(path) and os.readlink(path) == target \
                            and os.lstat(path).st_uid == os.getuid():
                        _record(record_dir, kind="shared", path=path, target=target)  # another job's, ours too
                        users["users"].append(me)
                        made.append(path)
                        continue
                    raise MountError(f"file_mounts.{remote}: {path} already exists on this node and corral did not "
                                     "make it for this job (nor for another of this account's jobs, to the same "
                                     "source); corral replaces nothing: remove it, or mount somewhere else"
                                     + (f" ({why}, so a mount is a link on the node itself: one source per path)"
                                        if why else ""))
                try:
                    dirs = _parents(record_dir, Path(path).parent)
                    _record(record_dir, kind="link", path=path, target=target)
                    os.symlink(target, path)
                except OSError as exc:
                    raise MountError(f"file_mounts.{remote}: the Unix account {_me()} cannot create {path} on this "
                                     f"node ({exc.strerror or exc})") from None
                if users is not None:
                    users.update(target=target, users=[me], dirs=dirs)
            made.append(path)
    return made


def _parents(record_dir: Path, directory: Path) -> list[str]:
    """Create the missing directories above a remote path, each recorded once made; returns
    them, deepest first."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for each in reversed(missing):
        try:
            os.mkdir(each)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs
        _record(record_dir, kind="dir", path=str(each))
    return [str(each) for each in missing]


def detach(record_dir: Path) -> list[str]:
    """Remove what ``attach`` made for the job on this node (latest first), then its record;
    returns what was removed. Something changed since (a link pointing elsewhere, a directory
    not empty) is left as it is."""
    removed = []
    if not record_dir.is_dir():
        return removed
    with _locked(record_dir):
        for entry in reversed(_records(record_dir)):
            path, kind = entry["path"], entry.get("kind")
            if kind in ("link", "shared"):
                removed += _leave(record_dir, path, entry.get("target"))
                continue
            try:
                if kind == "dir" and os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                elif kind == "copy" and Path(path).resolve().is_relative_to(record_dir.resolve()):
                    shutil.rmtree(path)
                else:
                    continue
            except OSError:
                continue
            removed.append(path)
        (record_dir / RECORD).unlink(missing_ok=True)
    shutil.rmtree(record_dir, ignore_errors=True)
    return removed


def _leave(record_dir: Path, path: str, target: str | None) -> list[str]:
    """The job stops using the link at ``path``: removed (with the directories made above it)
    when no other job of the account uses it, and only while it still points at ``target``."""
    me, removed = str(record_dir), []
    with _Users(path).held() as users:
        if users is not None and users.get("target") == target:
            users["users"] = [u for u in users["users"] if u != me]
            if users["users"]:
                return removed  # another job's still
            made = users.get("dirs") or []
        else:
            made = []  # (none shared: its own "dir" entries remove the directories)
        try:
            if os.path.islink(path) and os.readlink(path) == target:
                os.unlink(path)
                removed.append(path)
        except OSError:
            return removed
        for directory in made:  # deepest first; only while empty, and never through a link
            try:
                if os.path.isdir(directory) and not os.path.islink(directory):
                    os.rmdir(directory)
                    removed.append(directory)
            except OSError:
                break
    return removed


def _me() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


# The job's account may not reach the server's interpreter nor this file (a virtualenv under
# root's home): its text goes on the command line, run by that interpreter where the account
# may execute it, else by the node's python3.
_PICK = 'if [ -x "$0" ]; then exec "$0" "$@"; fi; exec python3 "$@"'


def _program(*args: str) -> list[str]:
    return ["sh", "-c", _PICK, sys.executable, "-I", "-c", Path(__file__).read_text(), *args]


def command(record_dir: Path, mounts: tuple[tuple[str, str], ...], home: str, run_dir: str = "") -> list[str]:
    """This file as a program attaching ``mounts`` as whoever runs it (then, after ``--``, a
    command it execs: ``main``)."""
    argv = _program("attach", str(record_dir), home, run_dir)
    for remote, source in mounts:
        argv += [remote, source]
    return argv


def attach_as(account, record_dir: Path, mounts: tuple[tuple[str, str], ...], home: str,  # noqa: ANN001
              why: str | None = None) -> None:
    """``attach`` as ``account`` (a ``UnixAccount``; None: this process's own, in it), for a
    replica that cannot bind them in a namespace of its own (``node.binds``). ``why``: why not
    (the default says whether the server is not root or namespaces were refused). Raises
    ``MountError``."""
    if why is None:
        why = ("the server does not run as root, so replicas have no mount namespace of their own"
               if os.geteuid() != 0 else "this node refuses mount namespaces")
    if account is None:
        attach(record_dir, list(mounts), home, why=why)
        return
    import subprocess

    done = subprocess.run(command(record_dir, mounts, home), user=account.uid, group=account.gid,
                          extra_groups=list(account.groups), cwd="/",
                          env={"PATH": SAFE_PATH, "LANG": "C.UTF-8", WHY_VAR: why},
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise MountError(said[-1].removeprefix("corral: ") if said else f"mounting failed (exit {done.returncode})")


def detach_as_owner(record_dir: Path) -> list[str]:
    """``detach`` as the account that owns the record (the job's): what it names is removed
    with that account's rights only, whatever the record says."""
    try:
        owner = os.lstat(record_dir).st_uid
    except FileNotFoundError:
        return []
    if owner == os.geteuid():
        return detach(record_dir)
    import subprocess

    try:
        entry = pwd.getpwuid(owner)
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    except (KeyError, OSError):
        return []  # an account gone since: nothing may act for it
    subprocess.run(_program("detach", str(record_dir)), user=owner,
                   group=entry.pw_gid, extra_groups=groups, cwd="/", env={"PATH": SAFE_PATH},
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    shutil.rmtree(record_dir, ignore_errors=True)  # the record itself, in the server's directory
    return []


def main(argv: list[str]) -> int:
    """``attach RECORD_DIR HOME RUN_DIR REMOTE SOURCE … [-- COMMAND …]`` (then exec COMMAND)
    or ``detach RECORD_DIR`` or ``pack SOURCE LIMIT`` (its archive to stdout); a mount that cannot appear is one line on stderr and exit 1,
    recorded in RUN_DIR (when given) as the attempt's start and exit, so the engine that ran
    this reports an attempt that failed, with its reason in the replica's log."""
    if argv[:1] == ["detach"] and len(argv) == 2:
        detach(Path(argv[1]))
        return 0
    if argv[:1] == ["pack"] and len(argv) == 3:  # a source as this account reads it, to stdout
        try:
            if size_of(argv[1], int(argv[2])) > int(argv[2]):
                return TOO_LARGE
            sys.stdout.buffer.write(pack(argv[1]))
        except OSError as exc:
            print(f"corral: {exc.strerror or exc}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] != ["attach"] or len(argv) < 3:
        print("usage: mounts.py attach RECORD_DIR HOME RUN_DIR [REMOTE SOURCE]… [-- COMMAND…] | detach RECORD_DIR",
              file=sys.stderr)
        return 2
    run_dir, rest = (argv[3], argv[4:]) if len(argv) > 3 else ("", [])
    then = rest[rest.index("--") + 1:] if "--" in rest else []
    pairs = rest[:rest.index("--")] if "--" in rest else rest
    try:
        attach(Path(argv[1]), list(zip(pairs[::2], pairs[1::2])), argv[2] or home_of_this_account(),
               why=os.environ.get(WHY_VAR, ""))
    except MountError as exc:
        print(f"corral: {exc}", file=sys.stderr)
        if run_dir:
            for name, text in (("started", str(os.getpid())), ("exit_code", "1")):
                with open(os.path.join(run_dir, name), "w") as out:
                    out.write(text + "\n")
        return 1
    if then:
        os.execvp(then[0], then)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
