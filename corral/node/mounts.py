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

On Slurm the nodes do not share the submitting machine's disks, only corral's home (and the
site's network filesystems): a source on neither (``must_stage``: another device than the
job's record directory, of a filesystem type not in ``SHARED_FS``) is **staged** when a step
starts, before its ``srun``, in the process that then becomes that ``srun`` (``stage``, off the
server's loop): copied once per job, as the job's account, into the job's record directory
(the layout ``copy_dir`` names, marked ``.complete``), which the nodes see. A source larger
than ``infra.slurm.file_mounts_max_gb`` is not copied: the step fails with a sentence naming
the mount, its size and the limit (``STAGE_FAILED`` in the attempt's run directory, the
replica's log). On a node, ``attach`` and ``here`` take a complete copy of the job's over
whatever the node has at the source's path (a node's own /data/x is not the submitter's);
``detach`` removes it with the record when the job ends.

A container binds the source where the node sees it, else that same copy (``here``; on
Slurm, the link ``seen_at`` that ``stage`` makes to the one or the other). On the
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
import stat
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
STAGE_FAILED = "mounts.err"  # in an attempt's run directory: why its sources could not be staged

# Filesystem types (``/proc/self/mountinfo``) a cluster's nodes mount alike: a source on one is
# taken to be seen by the nodes at the same path, so it is not staged. Network and cluster
# filesystems (NFS, SMB, AFS, Lustre, GPFS/Spectrum Scale, BeeGFS, CephFS, GlusterFS, WekaFS,
# PanFS, OrangeFS, shared-disk OCFS2/GFS2, and the FUSE clients of Ceph, Gluster, MooseFS,
# LizardFS, JuiceFS, Quobyte). Not among them, so staged: local disks, tmpfs, overlay, and
# 9p/virtiofs/sshfs (a VM's or a user's own share: the nodes may not mount it; staging a source
# the nodes do see costs a copy, not staging one they do not fails the job or, worse, gives it
# the node's own file at that path).
SHARED_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "afs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "wekafs",
    "panfs", "pvfs2", "orangefs", "ocfs2", "gfs2", "fuse.glusterfs", "fuse.ceph-fuse", "fuse.ceph", "fuse.cephfs",
    "fuse.mfs", "fuse.moosefs", "fuse.lizardfs", "fuse.juicefs", "fuse.quobyte", "fuse.weka",
})

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


def size_of(source: str, stop: int) -> int:
    """The bytes of a file, or of everything under a directory (links not followed); counting
    stops past ``stop``."""
    if not os.path.isdir(source) or os.path.islink(source):
        return os.lstat(source).st_size
    total = 0
    for root, dirs, files in os.walk(source):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
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


def human(size: float) -> str:
    """A size in bytes as people read it (``512 bytes``, ``3.2 MB``, ``1.0 GB``)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _unescape(field: str) -> str:
    """A path as ``/proc/self/mountinfo`` writes it (space, tab, newline, backslash octal-escaped)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def fs_type(path: str, mountinfo: str | None = None) -> str:
    """The type of the filesystem holding ``path`` (``ext4``, ``nfs4``, ``fuse.glusterfs`` …):
    that of the deepest mount above its real path in ``mountinfo`` (this process's
    ``/proc/self/mountinfo`` unless given; the last of several at one point, which hides the
    others). "" when none says."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as info:
                mountinfo = info.read()
        except OSError:
            return ""
    real = os.path.realpath(path)
    found, depth = "", -1
    for line in mountinfo.splitlines():  # ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL…] - TYPE SOURCE …
        fields = line.split(" ")
        dash = fields.index("-", 6) if "-" in fields[6:] else -1
        if dash < 0 or dash + 1 >= len(fields):
            continue
        point, kind = _unescape(fields[4]), fields[dash + 1]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= depth:
            found, depth = kind, len(point)
    return found


def must_stage(source: str, shared_dev: int, mountinfo: str | None = None) -> bool:
    """Whether Slurm's nodes may not see ``source`` at its path, so it is staged: it is neither
    on ``shared_dev`` (the device of corral's home, which the nodes share) nor on a filesystem
    of a type the nodes mount alike (``SHARED_FS``). Raises OSError when it cannot be read."""
    if os.stat(source).st_dev == shared_dev:
        return False
    return fs_type(source, mountinfo) not in SHARED_FS


def _copy_file(source: str, target: str) -> None:
    if not stat.S_ISREG(os.lstat(source).st_mode):  # a pipe or device would be read forever
        raise OSError(f"{source} is neither a file, a directory nor a link")
    shutil.copy2(source, target)


def _copy_tree(source: str, target: Path) -> None:
    """``source`` (a file, or a directory with its links kept as links) copied to ``target``,
    with this process's rights. Raises OSError naming what could not be copied."""
    if not os.path.isdir(source):
        _copy_file(os.path.realpath(source), str(target))
        return
    try:
        shutil.copytree(source, target, symlinks=True, copy_function=_copy_file)
    except shutil.Error as exc:  # every entry that failed: the first says why
        first = exc.args[0][0] if exc.args and isinstance(exc.args[0], list) and exc.args[0] else None
        raise OSError(first[2] if first and len(first) == 3 else str(exc)) from None


def stage(record_dir: Path, mounts: list[tuple[str, str]], limit: int, mountinfo: str | None = None) -> list[str]:
    """On the submitting machine, as the job's account (the caller's rights: ``stage_as``): copy
    each source the nodes may not see (``must_stage``) into the job's record directory, once per
    job (under the job's lock; a complete copy is kept), where a node's ``attach`` or ``here``
    takes it over its own path, and a container binds it through ``seen_at``. Returns the
    sources copied now. Raises ``MountError`` naming the mount: unreadable, larger than
    ``limit`` bytes, or not copied whole."""
    copied = []
    with _locked(record_dir):
        shared_dev = os.stat(record_dir).st_dev
        for remote, source in mounts:
            if staged(record_dir, source):
                continue  # another replica's step staged it (or an earlier attempt's)
            try:
                if not must_stage(source, shared_dev, mountinfo):
                    continue
                size = size_of(source, limit)
                if size > limit:  # counted on for the sentence, up to a bound (a huge tree is not walked whole)
                    size = size_of(source, 64 * limit)
            except OSError as exc:
                raise MountError(f"file_mounts.{remote}: the Unix account {_me()} cannot read {source} on the "
                                 f"submitting machine ({exc.strerror or exc})") from None
            if size > limit:
                raise MountError(f"file_mounts.{remote}: {source} is {'over ' if size > 64 * limit else ''}"
                                 f"{human(min(size, 64 * limit))}, larger than the {human(limit)} "
                                 "that corral copies for Slurm nodes that do not see it (config.yaml "
                                 "infra.slurm.file_mounts_max_gb): put it on a filesystem the nodes share, or "
                                 "raise the limit")
            target = copy_dir(record_dir, source)
            shutil.rmtree(target.parent, ignore_errors=True)  # a copy cut short earlier
            target.parent.mkdir(parents=True)
            _record(record_dir, kind="copy", path=str(target.parent))
            try:
                _copy_tree(source, target)
            except OSError as exc:
                raise MountError(f"file_mounts.{remote}: {source} could not be copied for the Slurm nodes, which "
                                 f"do not see it, as the Unix account {_me()} ({exc.strerror or exc})") from None
            target.parent.joinpath(COMPLETE).touch()
            copied.append(source)
        for _, source in mounts:  # (what a container binds: links inside the record, gone with it)
            link = seen_at(record_dir, source)
            want = str(copy_dir(record_dir, source)) if staged(record_dir, source) else source
            if os.path.islink(link) and os.readlink(link) == want:
                continue
            link.parent.mkdir(exist_ok=True)
            link.unlink(missing_ok=True)
            os.symlink(want, link)
    return copied


def _say(log_file: str, lines: list[str]) -> None:
    """Lines appended to the replica's log (as the job's account), if it has one."""
    if not log_file or not lines:
        return
    try:
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError:
        return
    try:
        os.write(fd, "".join(line + "\n" for line in lines).encode())
    finally:
        os.close(fd)


def _say_stage_failed(run_dir: str, log_file: str, why: str, pid: int) -> None:
    """A staging that failed, as the job's account: its sentence in the replica's log and the
    attempt's run directory, which records that the attempt started (``pid``: the srun
    client's) and exited 1, so the executor reports it ended, with that reason."""
    print(f"corral: {why}", file=sys.stderr)
    writes = [(log_file, f"corral: {why}", os.O_APPEND)] if log_file else []
    if run_dir:
        writes += [(os.path.join(run_dir, STAGE_FAILED), why, os.O_TRUNC),
                   (os.path.join(run_dir, "started"), str(pid), os.O_TRUNC),
                   (os.path.join(run_dir, "exit_code"), "1", os.O_TRUNC)]
    for path, text, mode in writes:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | mode, 0o644)
        except OSError:
            continue
        try:
            os.write(fd, (text + "\n").encode())
        finally:
            os.close(fd)


def stage_failure(run_dir: Path) -> str:
    """Why the attempt's sources could not be staged ("" when they were, or none had to be)."""
    try:
        return (run_dir / STAGE_FAILED).read_text().strip()
    except OSError:
        return ""


def stage_as(account: tuple[int, int, tuple[int, ...]] | None, record_dir: Path, mounts: list[tuple[str, str]],
             limit: int, run_dir: str = "", log_file: str = "") -> bool:
    """``stage`` with the rights of ``account`` (uid, gid, groups; None: this process's own), in
    a child that switches to it where this process is root, never with root's; a failure is
    said in ``run_dir`` and ``log_file`` as that account. Whether every source is in place."""
    def staging(pid: int) -> bool:
        try:
            copied = stage(record_dir, mounts, limit)
            _say(log_file, [f"corral: staged {source} for the Slurm nodes, which do not see it "
                            f"({human(size_of(str(copy_dir(record_dir, source)), 1 << 62))})" for source in copied])
            return True
        except MountError as exc:
            _say_stage_failed(run_dir, log_file, str(exc), pid)
            return False
        except OSError as exc:  # the record directory itself
            _say_stage_failed(run_dir, log_file, f"file_mounts: the job's sources could not be staged "
                                                 f"({exc.strerror or exc})", pid)
            return False

    if account is None or (account[0] == os.geteuid() and os.geteuid() != 0):
        return staging(os.getpid())
    if os.geteuid() != 0:
        _say_stage_failed(run_dir, log_file, "file_mounts: the job's sources cannot be staged as its account by a "
                                             "server that is not root", os.getpid())
        return False
    uid, gid, groups = account
    try:  # (loaded here: the account may not read this interpreter's modules, under root's home)
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        prctl = None
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # (the child: the account's rights only, then _exit)
        code = 1
        try:
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if prctl is not None:  # killed with the srun client that waits for it (its SIGKILL on cancel)
                prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL (set after setresuid, which clears it)
            if os.getppid() == parent:
                os.chdir("/")
                code = 0 if staging(parent) else 1
        except BaseException as exc:  # noqa: BLE001 - said, whatever it is: the child only exits
            _say_stage_failed(run_dir, log_file, f"file_mounts: the job's sources could not be staged ({exc})", parent)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def stage_command(record_dir: Path, mounts: tuple[tuple[str, str], ...], limit: int, run_dir: str, log_file: str,
                  account: tuple[int, int, tuple[int, ...]] | None) -> list[str]:
    """This file as a program staging ``mounts`` (``stage_as``), then, after ``--``, exec'ing
    the command that follows (the step's ``srun``: it keeps this process's pid). Run by the
    server's own account (it drops to the job's in a child), so it imports this module where
    the server has it, compiled once (its text on the command line, as nodes run it, would be
    compiled at every step's start: some 50 ms more), with nothing of the environment's."""
    uid, gid, groups = account if account is not None else ("", "", ())
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
            "from corral.node.mounts import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", code, "stage", str(record_dir), str(limit), run_dir, log_file, str(uid),
            str(gid), ",".join(str(g) for g in groups)]
    for remote, source in mounts:
        argv += [remote, source]
    return argv


def lacking(record_dir: Path, mounts: list[tuple[str, str]], sees: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The sources this node neither sees nor holds a copy of for the job: what must be sent."""
    return sorted({source for _, source in mounts if not sees(source)
                   and not staged(record_dir, source)})


def seen_at(record_dir: Path, source: str) -> Path:
    """A link, made by ``stage``, to what the job's replicas see of ``source``: its staged copy,
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


def mount_points(wanted: list[tuple[str, str, str]]) -> list[dict]:
    """For binds (``node.binds``), as the job's account: each ``(remote, target, source)``'s
    source as the account reaches it (device, inode, whether a directory), and a mount point
    at the target where nothing is there (an empty directory, or file, with the directories
    above it: what was made, deepest first, with device and inode). What this call made is
    removed again if a later mount fails. Raises ``MountError`` naming the mount."""
    out: list[dict] = []
    try:
        for remote, target, source in wanted:
            try:
                info = os.stat(source)
                readable = os.access(source, os.R_OK | (os.X_OK if os.path.isdir(source) else 0))
            except OSError as exc:
                info, readable, why = None, False, exc.strerror
            if info is None or not readable:
                raise MountError(f"file_mounts.{remote}: the Unix account {_me()} cannot read {source} on this node"
                                 f" ({why if info is None else 'permission denied'})")
            directory = os.path.isdir(source)
            made: list[list] = []
            out.append({"ident": [info.st_dev, info.st_ino], "directory": directory, "made": made})
            if os.path.lexists(target):
                continue
            try:
                missing, at = [], Path(target).parent
                while not os.path.lexists(at) and at != at.parent:
                    missing.append(at)
                    at = at.parent
                for each in [*reversed(missing), Path(target)]:
                    try:
                        if directory or each != Path(target):
                            os.mkdir(each, 0o755)
                        else:
                            os.close(os.open(each, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
                    except FileExistsError:
                        continue  # made meanwhile by someone else: theirs
                    made_now = os.lstat(each)
                    made.insert(0, [str(each), made_now.st_dev, made_now.st_ino])
            except OSError as exc:
                raise MountError(f"file_mounts.{remote}: the Unix account {_me()} cannot create {exc.filename or target}"
                                 f" on this node ({exc.strerror or exc})") from None
    except MountError:
        for entry in out:
            for path, _, _ in entry["made"]:
                try:
                    os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
                except OSError:
                    break
        raise
    return out


def mount_points_as(account, wanted: list[tuple[str, str, str]]) -> list[dict]:  # noqa: ANN001
    """``mount_points`` as ``account`` (None: this process's own, in it).

    In a child forked from this process that switches to the account without exec: a change
    of credentials leaves it undumpable, so the account cannot trace it nor write into its
    memory (as it could a program it execs: what it reports, the source's identity and what it
    made, would then be the account's to forge, and root binds and removes by it). What it
    made is checked again here: the target and directories above it, nothing else."""
    if account is None:
        return mount_points(wanted)
    import select
    import time

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: only system calls and this module's code, then _exit)
        code = 1
        try:
            os.close(read)
            os.setgroups(list(account.groups))
            os.setresgid(account.gid, account.gid, account.gid)
            os.setresuid(account.uid, account.uid, account.uid)
            os.chdir("/")
            try:
                data = json.dumps({"found": mount_points(wanted)}).encode()
            except MountError as exc:
                data = json.dumps({"error": str(exc)}).encode()
            while data:
                data = data[os.write(write, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    chunks, deadline = [], time.monotonic() + 120
    waiting = select.poll()  # (not select(): a server's descriptors pass 1024, which select cannot take)
    waiting.register(read, select.POLLIN)
    try:
        while time.monotonic() < deadline:
            ready = waiting.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if not ready:
                os.kill(pid, 9)
                break
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, 9)
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    try:
        said = json.loads(b"".join(chunks)) if os.waitstatus_to_exitcode(status) == 0 else {}
    except ValueError:
        said = {}
    if "error" in said:
        raise MountError(said["error"])
    found = said.get("found")
    if not isinstance(found, list) or len(found) != len(wanted):
        raise MountError(f"file_mounts.{wanted[0][0] if wanted else ''}: the mount points could not be checked "
                         f"as the job's account (exit {os.waitstatus_to_exitcode(status)})")
    for (remote, target, _), info in zip(wanted, found):
        allowed = {target, *(str(p) for p in Path(target).parents)}
        if any(entry[0] not in allowed for entry in info["made"]):
            raise MountError(f"file_mounts.{remote}: what was made for it is not at {target}")
    return found


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
    or ``detach RECORD_DIR`` or ``pack SOURCE LIMIT`` (its archive to stdout) or ``stage RECORD_DIR
    LIMIT RUN_DIR LOG_FILE UID GID GROUPS REMOTE SOURCE … [-- COMMAND …]`` (``stage_as``, then exec
    COMMAND); a mount that cannot appear is one line on stderr and exit 1,
    recorded in RUN_DIR (when given) as the attempt's start and exit, so the engine that ran
    this reports an attempt that failed, with its reason in the replica's log."""
    if argv[:1] == ["detach"] and len(argv) == 2:
        detach(Path(argv[1]))
        return 0
    if argv[:1] == ["mountpoints"] and len(argv) % 3 == 1:  # (remote, target, source)…: JSON to stdout
        try:
            print(json.dumps(mount_points(list(zip(argv[1::3], argv[2::3], argv[3::3])))))
        except MountError as exc:
            print(f"corral: {exc}", file=sys.stderr)
            return 1
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
    if argv[:1] == ["stage"] and len(argv) >= 8:
        # stage RECORD_DIR LIMIT RUN_DIR LOG_FILE UID GID GROUPS [REMOTE SOURCE]… [-- COMMAND…]
        rest = argv[8:]
        then = rest[rest.index("--") + 1:] if "--" in rest else []
        pairs = rest[:rest.index("--")] if "--" in rest else rest
        account = (int(argv[5]), int(argv[6]), tuple(int(g) for g in argv[7].split(",") if g)) if argv[5] else None
        if not stage_as(account, Path(argv[1]), list(zip(pairs[::2], pairs[1::2])), int(argv[2]), argv[3], argv[4]):
            return 1
        if then:
            os.execvp(then[0], then)
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
