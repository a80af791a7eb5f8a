"""A job's ``file_mounts`` sources for Slurm nodes that may not see them. On Slurm the nodes do
not share the submitting machine's disks, only corral's home (and the
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

What is staged is recorded in the job's record like any copy (``corral.node.mounts``), so the
node-side code finds it and ``detach`` removes it; this module is the submitting machine's
side: which sources need a copy, the copy itself (as the job's account), and the program the
Slurm executor puts before a step's ``srun``."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from corral.node.runfiles import read_small
from corral.node.mounts import (COMPLETE, MountError, TooDeep, _locked, _me, _record, copy_dir, entries, seen_at,
                                size_of, staged)

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
KEEP_FREE = 0.05  # of the filesystem holding corral's home, never taken by staged copies (its server's disk)
ENTRY_BYTES = 4096  # what each file, directory or link of a copy is counted at least (a block, an inode)
STAGE_FAILED = "mounts.err"  # in an attempt's run directory: why its sources could not be staged


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


def entries_allowed(limit: int) -> int:
    """How many files, directories and links a copy within ``limit`` bytes may hold: each at
    least ``ENTRY_BYTES`` (never fewer than 10,000)."""
    return max(limit // ENTRY_BYTES, 10_000)


def entries_in(source: str, stop: int) -> int:
    """The files, directories and links under a directory (0 for a file; links not followed);
    counting stops past ``stop``."""
    if not os.path.isdir(source) or os.path.islink(source):
        return 0
    total = 0
    for _ in entries(source):
        total += 1
        if total > stop:
            break
    return total


class _Budget:
    """The bytes a source's copy may take: its size is checked before the copy, but a file
    still being written (a log, or one grown on purpose) must not fill corral's home."""

    def __init__(self, limit: int) -> None:
        self.left, self.grew = limit, False
        self.entries = entries_allowed(limit)

    def count(self, directory: str, names: list[str]) -> set[str]:
        """``copytree``'s ``ignore``: a directory's entries counted before they are copied
        (empty files cost no bytes, but an inode each in corral's home). Ignores none."""
        self.entries -= len(names)
        if self.entries < 0:
            self.grew = True
            raise OSError(f"{directory} holds more files than the limit while it was copied")
        return set()

    def copy_file(self, source: str, target: str) -> None:
        """A regular file copied (then its mode and times), opened without following a link
        nor blocking (a pipe or device swapped in after a look would be read forever), no
        more than the bytes left."""
        if not stat.S_ISREG(os.lstat(source).st_mode):  # (not even opened: a device's open may act)
            raise OSError(f"{source} is neither a file, a directory nor a link")
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{source} is neither a file, a directory nor a link")
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                while chunk := os.read(fd, min(1 << 20, self.left + 1)):
                    if len(chunk) > self.left:
                        self.grew = True
                        raise OSError(f"{source} grew past the limit while it was copied")
                    self.left -= len(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(out)
            shutil.copystat(fd, target)
        finally:
            os.close(fd)


def _copy_tree(source: str, target: Path, budget: _Budget) -> None:
    """``source`` (a file, or a directory with its links kept as links) copied to ``target``,
    with this process's rights, within ``budget``. Raises OSError naming what could not be
    copied."""
    if not os.path.isdir(source):
        budget.copy_file(os.path.realpath(source), str(target))
        return
    try:
        shutil.copytree(source, target, symlinks=True, copy_function=budget.copy_file, ignore=budget.count)
    except shutil.Error as exc:  # every entry that failed: the first says why
        first = exc.args[0][0] if exc.args and isinstance(exc.args[0], list) and exc.args[0] else None
        raise OSError(first[2] if first and len(first) == 3 else str(exc)) from None


def _room(record_dir: Path) -> tuple[int, int]:
    """The bytes this account may still write where the record is, and those kept free there
    (``KEEP_FREE`` of the filesystem): many jobs' copies (an array's elements, each within the
    limit) must not fill the disk of the server's home."""
    info = os.statvfs(record_dir)
    return info.f_bavail * info.f_frsize, int(info.f_blocks * info.f_frsize * KEEP_FREE)


def too_large(source: str, limit: int) -> tuple[int, str]:
    """The bytes of ``source`` (counted up to a bound: a huge tree is not walked whole) and why
    it is more than corral copies for Slurm nodes within ``limit`` bytes ("" when it is not): its
    size, or its count of files. Raises OSError when it cannot be read."""
    real = os.path.realpath(source)  # what a copy reads: a source that is a link is followed
    size = size_of(real, limit)
    if size > limit:  # counted on for the sentence
        size = size_of(real, 64 * limit)
    elif entries_in(real, entries_allowed(limit)) > entries_allowed(limit):
        return size, (f"{source} holds over {entries_allowed(limit):,} files, directories and links, more than "
                      f"corral copies for Slurm nodes that do not see it within {human(limit)} (each counted at "
                      f"least {ENTRY_BYTES} bytes; config.yaml infra.slurm.file_mounts_max_gb): put it on a "
                      "filesystem the nodes share, pack it into fewer files, or raise the limit")
    if size <= limit:
        return size, ""
    return size, (f"{source} is {'over ' if size > 64 * limit else ''}{human(min(size, 64 * limit))}, larger than "
                  f"the {human(limit)} that corral copies for Slurm nodes that do not see it (config.yaml "
                  "infra.slurm.file_mounts_max_gb): put it on a filesystem the nodes share, or raise the limit")


def oversized(record_root: Path, mounts: list[tuple[str, str]], limit: int,
              mountinfo: str | None = None) -> dict[str, str]:
    """At submission, on the submitting machine: {remote: why} for each source the Slurm nodes
    may not see (``must_stage``, against the device of ``record_root``, where the jobs' records
    are) that ``stage`` would refuse as too large, so the job is refused before it queues rather
    than failing when its step starts (which checks again: a source may change meanwhile). A
    source that cannot be read is left to the other checks."""
    problems: dict[str, str] = {}
    try:
        shared_dev = os.stat(record_root).st_dev
    except OSError:
        return problems
    for remote, source in mounts:
        try:
            over = must_stage(source, shared_dev, mountinfo) and too_large(source, limit)[1]
        except TooDeep as exc:
            over = str(exc)
        except OSError:
            continue
        if over:
            problems[remote] = over
    return problems


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
                size, over = too_large(source, limit)
            except TooDeep as exc:
                raise MountError(f"file_mounts.{remote}: {exc}") from None
            except OSError as exc:
                raise MountError(f"file_mounts.{remote}: the Unix account {_me()} cannot read {source} on the "
                                 f"submitting machine ({exc.strerror or exc})") from None
            if over:
                raise MountError(f"file_mounts.{remote}: {over}")
            free, keep = _room(record_dir)
            if size + keep > free:
                raise MountError(f"file_mounts.{remote}: {source} ({human(size)}) does not fit in corral's home, "
                                 f"where the Slurm nodes would see its copy: {human(max(free - keep, 0))} is left "
                                 f"there for copies ({human(keep)} is kept free): put it on a filesystem the nodes "
                                 "share, or free space in corral's home")
            target = copy_dir(record_dir, source)
            shutil.rmtree(target.parent, ignore_errors=True)  # a copy cut short earlier
            target.parent.mkdir(parents=True)
            _record(record_dir, kind="copy", path=str(target.parent))
            budget = _Budget(limit)
            try:
                _copy_tree(source, target, budget)
            except OSError as exc:
                shutil.rmtree(target.parent, ignore_errors=True)  # (recorded: gone with the job anyway)
                if budget.grew:
                    raise MountError(f"file_mounts.{remote}: {source} grew past the {human(limit)} that corral "
                                     "copies for Slurm nodes that do not see it while it was copied (config.yaml "
                                     "infra.slurm.file_mounts_max_gb): put it on a filesystem the nodes share, or "
                                     "stop writing it before the job starts") from None
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


def _write(path: str, text: str, mode: int) -> None:
    """``text`` written to ``path`` as this process's account (never through a link), if it may."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | mode, 0o644)
    except OSError:
        return
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _say(log_file: str, lines: list[str]) -> None:
    """Lines appended to the replica's log (as the job's account), if it has one."""
    if log_file and lines:
        _write(log_file, "".join(line + "\n" for line in lines), os.O_APPEND)


def _say_stage_failed(run_dir: str, log_file: str, why: str, pid: int) -> None:
    """A staging that failed, as the job's account: its sentence in the replica's log and the
    attempt's run directory, which records that the attempt started (``pid``: the srun
    client's) and exited 1, so the executor reports it ended, with that reason."""
    print(f"corral: {why}", file=sys.stderr)
    _say(log_file, [f"corral: {why}"])
    if run_dir:
        for name, text in ((STAGE_FAILED, why), ("started", str(pid)), ("exit_code", "1")):
            _write(os.path.join(run_dir, name), text + "\n", os.O_TRUNC)


def stage_failure(run_dir: Path) -> str:
    """Why the attempt's sources could not be staged ("" when they were, or none had to be).
    Read by the server (root) in a directory of the job's account (``runfiles``)."""
    return (read_small(run_dir / STAGE_FAILED) or "").strip()


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
            "from corral.node.staging import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", code, "stage", str(record_dir), str(limit), run_dir, log_file, str(uid),
            str(gid), ",".join(str(g) for g in groups)]
    for remote, source in mounts:
        argv += [remote, source]
    return argv


def main(argv: list[str]) -> int:
    """``stage RECORD_DIR LIMIT RUN_DIR LOG_FILE UID GID GROUPS [REMOTE SOURCE]… [-- COMMAND…]``:
    ``stage_as``, then exec COMMAND (the step's ``srun``)."""
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
    print("usage: staging.py stage RECORD_DIR LIMIT RUN_DIR LOG_FILE UID GID GROUPS [REMOTE SOURCE]… [-- COMMAND…]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
