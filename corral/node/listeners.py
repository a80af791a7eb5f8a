"""Who answers on an address and port of this machine: the process holding the listening
socket a connection there reaches.

Replicas on one machine share its network stack (unless they have namespaces of their own),
so an answer on a replica's address is not proof that the replica gave it: a sibling bound to
``0.0.0.0`` on the same port answers for every address nobody bound exactly, and so may any
other account's process. A readiness probe that passes is therefore checked here against the
replica's own processes. The kernel's tables (``/proc/net/tcp``, ``tcp6``) give the listening
sockets and their inodes; ``/proc/PID/fd`` links name the sockets a process holds.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _address(hexed: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexed)
    # each 32-bit word is written in the machine's byte order
    words = b"".join(int.from_bytes(raw[i:i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(port: int, proc: Path = Path("/proc")) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Every listening TCP socket on ``port``: (bound address, socket inode)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            local, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port:
                found.append((_address(local), int(fields[9])))
    return found


def answering(addr: str, port: int, proc: Path = Path("/proc")) -> set[int]:
    """The inodes of the sockets a connection to ``addr:port`` reaches: those bound to that very
    address if any, else those bound to every address (0.0.0.0, or ``::`` taking IPv4 too)."""
    target = ipaddress.ip_address(addr)
    bound = listeners(port, proc)
    exact = {inode for a, inode in bound
             if a == target or (a.version == 6 and a.ipv4_mapped == target)}
    if exact:
        return exact
    return {inode for a, inode in bound if a.is_unspecified}


def sockets_of(pids: list[int], proc: Path = Path("/proc")) -> set[int]:
    """The socket inodes the processes ``pids`` hold open."""
    held = set()
    for pid in pids:
        fds = proc / str(pid) / "fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                link = os.readlink(fds / name)
            except OSError:
                continue
            if link.startswith("socket:["):
                held.add(int(link[8:-1]))
    return held


def who_answers(addr: str, port: int, pids: list[int], proc: Path = Path("/proc")) -> str | None:
    """None when one of ``pids`` holds the socket that answers ``addr:port``; else why not, as a
    sentence for the replica's status."""
    sockets = answering(addr, port, proc)
    if not sockets:
        return f"nothing listens on {addr}:{port}"
    if sockets & sockets_of(pids, proc):
        return None
    return (f"{addr}:{port} is answered by a process that is not this replica's (another replica or program "
            f"bound the port on {'every address' if _wildcard(port, sockets, proc) else addr})")


def _wildcard(port: int, sockets: set[int], proc: Path) -> bool:
    return any(a.is_unspecified for a, inode in listeners(port, proc) if inode in sockets)
