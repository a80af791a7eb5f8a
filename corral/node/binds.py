"""A job's ``file_mounts`` as binds inside each replica's own mount namespace, where the
local executor's server runs as root and may make namespaces (``corral.node.namespaces``).

Each replica sees its own source at the remote path and nothing changes on the machine
itself, so two jobs (or two accounts) mounting different sources at one path run side by
side. Where the machine has nothing at a remote path, the bind needs a mount point there: an
empty directory (or file) made with the job's account's rights, as a link would be
(``corral.node.mounts``), and removed when no job on this machine uses it any more. Who uses
which mount point is kept machine-wide (``STATE_DIR``, root's, one file per path under a
lock), since several servers (several ``CORRAL_HOME``) share the machine's paths.

Safety. The binds are made by root, so nothing the job's account controls may steer them:
the source is the inode the account reached (its device and inode, taken as the account,
checked again on the descriptor bound), and the target is walked one component at a time
without following a link any account but root made, then checked against what no job may
shadow: the system's directories (``corral.spec.mounts``) and corral's own (its home and
runtime directory: the replica's wrapper, still root, writes there after the binds). A
replica with binds runs with ``no_new_privs``: no setuid program it starts gains rights, so
none can be fooled by a file bound where it looks (a timestamp, a configuration)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path


STATE_DIR = Path("/run/corral-mountpoints")
MS_BIND = 0x1000
MS_REC = 0x4000
NO_NEW_PRIVS = ["setpriv", "--no-new-privs", "--"]  # (what the replica's wrapper starts under)



class BindError(OSError):
    """A bind that cannot be made; its message is one sentence naming ``file_mounts.REMOTE``."""

    def __str__(self) -> str:
        return self.args[0] if self.args else "file_mounts: could not be bound"


@dataclass(frozen=True)
class Bind:
    remote: str  # as written: the field's name
    target: str  # the path on this node (``~`` expanded)
    source: str
    ident: tuple[int, int]  # the source's (device, inode) as the job's account reached it
    directory: bool


# -- mount points on the machine -------------------------------------------------------------

class _State:
    """The users (the jobs' record directories) of the mount point at one path, and what was
    made for it (paths with their device and inode, deepest first), under an exclusive lock."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def __enter__(self) -> dict:
        while True:
            self.fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:  # removed by its last user while we waited: take the one that replaced it
                if os.stat(self.file, follow_symlinks=False).st_ino == os.fstat(self.fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(self.fd)
        try:
            self.state = json.loads(os.read(self.fd, 1 << 20) or b"{}")
        except ValueError:
            self.state = {}
        # a job whose record is gone has ended (a server that crashed never said so)
        self.state["users"] = [u for u in self.state.get("users", []) if isinstance(u, str) and os.path.isdir(u)]
        self.state.setdefault("made", [])
        return self.state

    def __exit__(self, *exc: object) -> None:
        try:
            if self.state["users"]:
                data = json.dumps(self.state).encode()
                os.lseek(self.fd, 0, os.SEEK_SET)
                os.ftruncate(self.fd, 0)
                os.write(self.fd, data)
            else:
                left = _remove(self.state["made"], bool(self.state.get("above")))
                if left:  # a directory above still holds another's mount point: removed after it
                    data = json.dumps({"users": [], "made": left, "above": True}).encode()
                    os.lseek(self.fd, 0, os.SEEK_SET)
                    os.ftruncate(self.fd, 0)
                    os.write(self.fd, data)
                else:
                    os.unlink(self.file)
        finally:
            os.close(self.fd)


def _state_file(path: str) -> Path:
    """The state of the mount point at ``path`` on the filesystem this process sees there: the
    path with the device of its nearest existing parent (what corral makes for a mount point
    stays on that device), so processes of one machine that see different filesystems at one
    path (Ray workers in mount namespaces of their own) never share, or remove, each other's."""
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    at = os.path.dirname(os.path.normpath(path)) or "/"
    while True:
        try:
            device = os.stat(at).st_dev
            break
        except OSError:
            if at == "/":
                device = 0
                break
            at = os.path.dirname(at)
    return STATE_DIR / (hashlib.sha1(f"{device}:{path}".encode()).hexdigest()[:24] + ".json")


class _LinkRefused(Exception):
    """A link on the way that an account other than root made (``component``: where)."""

    def __init__(self, component: str) -> None:
        super().__init__(component)
        self.component = component


def _walk(path: str) -> tuple[int, str]:
    """``path`` opened (O_PATH) one component at a time, through no link but root's: an account
    that made a link on the way could otherwise point root's bind or removal somewhere else (and
    an inode of the same number there may be something else's). Returns the descriptor and the
    real path it reached (links resolved: so a ``..`` in a link's text is taken lexically on a
    path that holds none). Raises ``_LinkRefused``, or the ``OSError`` of a missing component."""
    rest, real, fd, hops = [p for p in path.split("/") if p], "", os.open("/", os.O_PATH | os.O_CLOEXEC), 0
    try:
        while rest:
            name = rest.pop(0)
            if name == ".":
                continue
            nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            info = os.fstat(nxt)
            if stat.S_ISLNK(info.st_mode):
                os.close(nxt)
                hops += 1
                if info.st_uid != 0 or hops > 40:
                    raise _LinkRefused(f"{real}/{name}")
                whole = os.path.normpath(os.path.join(real or "/", os.readlink(name, dir_fd=fd)))
                rest = [p for p in whole.split("/") if p] + rest
                os.close(fd)
                fd, real = os.open("/", os.O_PATH | os.O_CLOEXEC), ""
                continue
            os.close(fd)
            fd, real = nxt, f"{real}/{name}"
        return fd, real or "/"
    except BaseException:
        os.close(fd)
        raise


def _shadows(path: str, own: tuple[str, ...]) -> str | None:
    # imported when a job has file_mounts: a Ray worker imports this module for every replica
    # actor, and the spec's validators bring pydantic
    from corral.spec.mounts import shadows

    return shadows(path, own)


def _open_dir(path: str) -> int | None:
    """``path``, a directory, opened through root's links only (``_walk``), or None."""
    try:
        fd, _ = _walk(path)
    except (_LinkRefused, OSError):
        return None
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _remove(made: list, above: bool = False) -> list:
    """What was made for a mount point, deepest first, each only while it is the very inode
    made (an empty directory, an empty file): never anything put there since. Returns what is
    left to remove later: from a directory that is not empty yet (another mount point made
    below it, of this or another job, goes later) on; [] when done or when what is there is no
    longer what was made. ``above``: ``made`` is what was left above another's mount point."""
    for at, (path, dev, ino) in enumerate(made):
        parent = _open_dir(os.path.dirname(path))
        if parent is None:
            return []
        try:
            name = os.path.basename(path)
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if (info.st_dev, info.st_ino) != (dev, ino):
                return []
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(name, dir_fd=parent)
            elif stat.S_ISREG(info.st_mode) and info.st_size == 0:
                os.unlink(name, dir_fd=parent)
            else:
                return []
        except OSError as exc:  # (not empty: someone's, or a mount point below still in use)
            return made[at:] if exc.errno == errno.ENOTEMPTY and (at > 0 or above) else []
        finally:
            os.close(parent)
    return []


def prepare(record_dir: Path, mounts: tuple[tuple[str, str], ...], home: str, account,  # noqa: ANN001
            own: tuple[str, ...]) -> list[Bind]:
    """Each mount ready to bind: its source's identity as the job's account reaches it, and a
    mount point at its target (made by the account where the machine has none, and used by
    this job until ``release``). Raises ``BindError`` naming the mount."""
    from corral.node.mounts import MountError, expand, home_of_this_account
    from corral.node.mountpoints import mount_points_as

    home = home or (account.home if account is not None else home_of_this_account())
    wanted = [(remote, expand(remote, home), source) for remote, source in mounts]
    for remote, target, _ in wanted:
        why = _shadows(os.path.normpath(target), own)
        if why:
            raise BindError(f"file_mounts.{remote}: {why}")
    targets = sorted({target for _, target, _ in wanted})
    states = {target: _State(_state_file(target)) for target in targets}
    held: dict[str, dict] = {}
    try:
        for target in targets:  # (in path order: two starts never wait on each other's)
            held[target] = states[target].__enter__()
        try:
            found = mount_points_as(account, wanted)
        except MountError as exc:
            raise BindError(str(exc)) from None
        for (_, target, _), info in zip(wanted, found):
            if info["made"]:  # (and what is left above it from before, to remove after it)
                now = {m[0] for m in info["made"]}
                held[target]["made"] = info["made"] + [m for m in held[target]["made"] if m[0] not in now]
                held[target].pop("above", None)
            if str(record_dir) not in held[target]["users"]:
                held[target]["users"].append(str(record_dir))
    finally:
        for target in reversed(list(held)):
            states[target].__exit__(None, None, None)
    return [Bind(remote, target, source, tuple(info["ident"]), info["directory"])
            for (remote, target, source), info in zip(wanted, found)]


def release(record_dir: Path) -> None:
    """The job no longer uses its mount points: each one no job uses any more goes."""
    try:
        files = sorted(STATE_DIR.glob("*.json"))
    except OSError:
        return
    for _ in range(8):  # (again: a directory made above one mount point may be empty only after another's went)
        for file in files:
            try:
                with _State(file) as state:  # (pruning users gone, and removing what none uses)
                    state["users"] = [u for u in state["users"] if u != str(record_dir)]
            except OSError:
                continue
        try:
            files, before = sorted(STATE_DIR.glob("*.json")), files
        except OSError:
            return
        if files == before:
            return


# -- in the replica's namespace (the namespace thread, before the fork) ----------------------------

def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _open_target(bind: Bind, own: tuple[str, ...]) -> int:
    """The target opened through root's links only (``_walk``), and its real path checked: a
    descriptor to bind onto."""
    try:
        fd, real = _walk(bind.target)
    except _LinkRefused as exc:
        raise BindError(f"file_mounts.{bind.remote}: {exc.component} is a link another account made: "
                        "mount at the path it leads to") from None
    except FileNotFoundError:
        raise BindError(f"file_mounts.{bind.remote}: {bind.target} does not exist in the replica's view "
                        "(inside another mount's source?)") from None
    why = _shadows(real, own)
    if why:
        os.close(fd)
        raise BindError(f"file_mounts.{bind.remote}: {bind.target} leads to {real}: {why}")
    return fd


SYS_MOUNT_SETATTR = 442  # (one number on every architecture: it came after the syscall tables were unified)
AT_RECURSIVE = 0x8000
MOUNT_ATTR_NOSUID = 0x2


def _nosuid(libc: ctypes.CDLL) -> None:
    """Every mount of this (the replica's) namespace nosuid: a process that joins it later
    (``corral exec``, an exec probe: ``nsenter``, without the replica's no_new_privs) gains no
    rights from a setuid program either. Where the kernel has no ``mount_setattr`` (before
    5.12) the replica's own no_new_privs is what holds."""
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_NOSUID, 0, 0, 0)
    libc.syscall(SYS_MOUNT_SETATTR, -100, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))


def bind_all(binds: list[Bind], own: tuple[str, ...]) -> None:
    """Bind each source over its target in this thread's (the replica's) mount namespace,
    shallowest first, so a mount inside another's remote path lands inside it; then make
    every mount of the namespace nosuid (``_nosuid``)."""
    if not binds:
        return
    libc = _libc()
    for bind in sorted(binds, key=lambda b: b.target.count("/")):
        target = _open_target(bind, own)
        try:
            try:
                source = os.open(bind.source, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise BindError(f"file_mounts.{bind.remote}: {bind.source} cannot be opened ({exc.strerror})") from None
            try:
                info, there = os.fstat(source), os.fstat(target)
                if (info.st_dev, info.st_ino) != bind.ident:
                    raise BindError(f"file_mounts.{bind.remote}: {bind.source} changed while the replica started")
                if stat.S_ISDIR(info.st_mode) != stat.S_ISDIR(there.st_mode):
                    kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a file"
                    raise BindError(f"file_mounts.{bind.remote}: {bind.target} is "
                                    f"{'a directory' if stat.S_ISDIR(there.st_mode) else 'a file'} on this node "
                                    f"and {bind.source} is {kind}: mount it somewhere else")
                if libc.mount(f"/proc/self/fd/{source}".encode(), f"/proc/self/fd/{target}".encode(), None,
                              MS_BIND | MS_REC, None) != 0:
                    errno = ctypes.get_errno()
                    raise BindError(f"file_mounts.{bind.remote}: {bind.source} could not be bound at {bind.target} "
                                    f"({os.strerror(errno)})")
            finally:
                os.close(source)
        finally:
            os.close(target)
    _nosuid(libc)
