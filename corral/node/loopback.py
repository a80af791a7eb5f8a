"""The loopback addresses one server home gives its local replicas: a block of its own.

Linux routes all of 127.0.0.0/8 to ``lo``, so each replica on this machine gets an address of
its own there and two replicas may serve one declared port. Addresses come from a replica's
row id, and every home numbers its rows from 1: two servers on one machine (two users, or one
user's two homes) would hand out the same addresses, and one's readiness probes and clients
would reach the other's replicas. So each home holds a block, ``127.B.0.0/16`` (B from 1 to
254; 127.0.x.x is left to the machine's own services), claimed machine-wide with ``flock`` on
``B.lock`` in a directory every account may write (``/tmp/corral-loopback``, sticky, like
``/tmp`` itself). The lock lives as long as the server's open file does, so a crashed server
frees its block at once; the block taken is remembered in the home, and taken again on the
next start when still free, so replicas adopted after a restart and new ones share it.

An account that holds every block's lock (on purpose or not) only stops homes from claiming
one: such a home falls back to the block its path hashes to, unclaimed, and says so in its
log. Who actually answers on an address is checked where it matters (a readiness probe counts
only when a process of the probed replica holds the socket, ``corral.node.listeners``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("corral.loopback")

CLAIMS_DIR = Path(os.environ.get("CORRAL_LOOPBACK_CLAIMS", "/tmp/corral-loopback"))
BLOCKS = range(1, 255)  # 127.1.0.0/16 … 127.254.0.0/16
PER_BLOCK = 256 * 254  # b 0-255, c 1-254 (never .0 or .255)


def address(block: int, replica_id: int) -> str:
    """127.``block``.b.c from the replica's row id; it wraps after 65,024 replicas."""
    index = (replica_id - 1) % PER_BLOCK
    return f"127.{block}.{index // 254}.{1 + index % 254}"


class LoopbackBlock:
    """A home's block of loopback addresses, held while this object is open."""

    def __init__(self, number: int, fd: int | None):
        self.number = number
        self._fd = fd  # the claim's lock (None: the fallback, unclaimed)

    @property
    def claimed(self) -> bool:
        return self._fd is not None

    def address(self, replica_id: int) -> str:
        return address(self.number, replica_id)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the last descriptor of its open file
            self._fd = None

    @classmethod
    def claim(cls, home: Path, claims: Path = CLAIMS_DIR) -> LoopbackBlock:
        """The block this home had last time if it is free, else the first free one from the
        block its path hashes to; unclaimed at the hashed block if none can be had."""
        remembered = home / "loopback-block"
        hashed = 1 + int(hashlib.sha1(str(home.resolve()).encode()).hexdigest(), 16) % len(BLOCKS)
        order = [n for n in BLOCKS[hashed - 1:]] + [n for n in BLOCKS[:hashed - 1]]
        try:
            last = int(remembered.read_text().strip())
            if last in BLOCKS:
                order.remove(last)
                order.insert(0, last)
        except (OSError, ValueError):
            pass
        try:
            _usable_dir(claims)
        except OSError as exc:
            log.warning("no loopback block claimed (%s); this home's replicas use 127.%d.x.x unclaimed", exc, hashed)
            return cls(hashed, None)
        for number in order:
            fd = _try_lock(claims / f"{number}.lock")
            if fd is None:
                continue
            try:
                remembered.write_text(f"{number}\n")
            except OSError:
                pass  # a read-only home: the block is still ours, only not remembered
            return cls(number, fd)
        log.warning("every loopback block is held by another server; this home's replicas use 127.%d.x.x unclaimed",
                    hashed)
        return cls(hashed, None)


def _usable_dir(path: Path) -> None:
    """Make the claims directory (sticky, writable by all, as /tmp) or check the one there: a
    directory another account owns and may empty is no place for claims."""
    try:
        path.mkdir(mode=0o1777)
        os.chmod(path, 0o1777)  # past the umask
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{path} is not a directory")
    if info.st_uid not in (0, os.geteuid()) and not info.st_mode & stat.S_ISVTX:
        raise OSError(errno.EPERM, f"{path} belongs to uid {info.st_uid} and is not sticky")


def _try_lock(path: Path) -> int | None:
    """A descriptor holding ``path``'s exclusive lock, or None while another holds it. The file
    is opened without O_CREAT first: in a sticky directory, the kernel's protected_regular
    refuses O_CREAT on another account's existing file."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            except FileExistsError:
                continue  # made by another just now: open it as it is
            except OSError:
                return None
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd
    return None
