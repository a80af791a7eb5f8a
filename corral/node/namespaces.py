"""Attempts started inside their own mount and UTS namespaces, with no program in between.

Where the server may make namespaces, every attempt gets a private mount namespace with its
job's hosts file bound over ``/etc/hosts`` and a UTS namespace named after the replica (see
``corral.node.runner``). Made by the wrapper, that is two more programs per start (``unshare``
and ``mount``): about 3.5 ms of CPU, a third of what a trivial job costs in all, and 5-10 ms
before the user's command runs on a busy 2-core machine.

Namespaces belong to a thread as much as to a process, and a child starts in those of the
thread that forks it. So a thread used for nothing else (a few, so a gang's starts overlap)
enters fresh namespaces (``unshare(2)``), makes its mounts private, binds the hosts file and
names itself (``mount(2)``, ``sethostname(2)``), starts the attempt's wrapper, and goes back to the
server's namespaces (``setns(2)``) before the next start: the new namespaces then belong to
the attempt alone, and the server's own are never changed. Python has no ``mount`` and (before
3.12) no ``unshare`` or ``setns``, so they are called from the C library.

With a ``Bridge`` (``infra: {local: {network: namespace}}``, see ``corral.node.network``) the
thread also enters a fresh network namespace and wires it before the fork, by netlink: a
socket it made at its start in the server's namespace creates the veth pair (the machine's
end on the bridge, the other in the new namespace), one made inside configures that end.
"""

from __future__ import annotations

import ctypes
import os
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from corral.node.netlink import Netlink

if TYPE_CHECKING:
    from corral.node.network import Bridge

T = TypeVar("T")

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


class NamespaceError(OSError):
    """The thread could not enter fresh namespaces, or could not come back from them."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise NamespaceError(errno, f"{what}: {os.strerror(errno)}")


class NamespaceSpawner:
    """Runs a start (a callable that forks the attempt) on a namespace thread, inside a fresh
    mount namespace where ``hosts`` is ``/etc/hosts`` and a fresh UTS namespace named ``name``.

    Several threads take starts from one queue, so a gang's forks are made side by side: a
    fork waits for its child's ``exec`` (vfork) without holding the GIL, and on a busy machine
    that wait, not the namespaces, is most of a start. With a bridge there is one thread: its
    netlink socket is no thread's to share."""

    def __init__(self, bridge: Bridge | None = None, threads: int = 1) -> None:
        self._libc = _libc()
        self.bridge = bridge  # each start in a network namespace of its own, on this bridge
        self._queue: queue.SimpleQueue[tuple[str, str, tuple[str, str] | None, Callable[[], object], Future] | None] \
            = queue.SimpleQueue()
        self.broken: str | None = None  # why starts can no longer be made here (the caller falls back)
        self._readies: list[Future] = []
        self._threads: list[threading.Thread] = []
        for i in range(1 if bridge is not None else max(1, threads)):
            ready: Future = Future()
            self._readies.append(ready)
            self._threads.append(threading.Thread(target=self._run, args=(ready,), daemon=True,
                                                  name=f"corral-namespaces-{i}"))
            self._threads[-1].start()

    @classmethod
    def create(cls, bridge: Bridge | None = None, threads: int = 1) -> NamespaceSpawner | None:
        """A spawner whose thread could enter fresh namespaces and come back, or None (not root,
        no CAP_SYS_ADMIN, a seccomp profile that refuses unshare)."""
        spawner = cls(bridge, threads)
        try:
            for ready in spawner._readies:  # every thread, or none: a start may land on any of them
                ready.result(timeout=10)
        except (OSError, TimeoutError):
            spawner.close()
            return None
        return spawner

    def start(self, hosts: str, name: str, fork: Callable[[], T], net: tuple[str, str] | None = None) -> T:
        """``fork()``'s result, called on the namespace thread inside the attempt's namespaces;
        its exception otherwise. A ``NamespaceError`` means nothing was forked. ``net``
        (address, the machine's end of its veth pair) with a bridge: its own network too."""
        return self.submit(hosts, name, fork, net).result()

    def submit(self, hosts: str, name: str, fork: Callable[[], T], net: tuple[str, str] | None = None) -> Future:
        """``start`` without waiting: the future of its result. Starts are made in the order
        submitted, so a gang's caller prepares its next replica while this one is forked."""
        if self.broken is not None:
            raise NamespaceError(0, self.broken)
        done: Future = Future()
        self._queue.put((hosts, name, net, fork, done))
        return done

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _run(self, ready: Future) -> None:
        try:
            home_mnt = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            home_uts = os.open("/proc/thread-self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
            if self.bridge is not None:  # (then this is the only thread)
                self._home_net = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            # made here and now, in the server's network namespace: it stays that namespace's
            self._host_netlink = Netlink() if self.bridge is not None else None
            self._enter("", "", None)  # the first round trip proves both ways work here
            self._leave(home_mnt, home_uts)
        except OSError as exc:
            self.broken = str(exc)
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while (item := self._queue.get()) is not None:
            hosts, name, net, fork, done = item
            if self.broken is not None:
                done.set_exception(NamespaceError(0, self.broken))
                continue
            try:
                self._enter(hosts, name, net)
            except OSError as exc:
                done.set_exception(exc if isinstance(exc, NamespaceError) else NamespaceError(exc.errno, str(exc)))
                self._come_back(home_mnt, home_uts)
                continue
            try:
                done.set_result(fork())
            except BaseException as exc:  # the caller's to handle (a bad cwd, no bash)
                done.set_exception(exc)
            self._come_back(home_mnt, home_uts)
        os.close(home_mnt)
        os.close(home_uts)
        if self.bridge is not None:
            os.close(self._home_net)
        if self._host_netlink is not None:
            self._host_netlink.close()

    def _enter(self, hosts: str, name: str, net: tuple[str, str] | None) -> None:
        flags = CLONE_NEWNS | CLONE_NEWUTS | (CLONE_NEWNET if self.bridge is not None else 0)
        _check(self._libc.unshare(flags), "unshare")
        # Private, so the bind below never propagates to the machine's own mount namespace.
        _check(self._libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        if hosts:
            _check(self._libc.mount(os.fsencode(hosts), b"/etc/hosts", None, MS_BIND, None),
                   f"binding {hosts} over /etc/hosts")
        if name:
            socket.sethostname(name)
        if self.bridge is not None:
            resolv = self.bridge.resolv_conf
            if resolv.exists() and os.path.exists("/etc/resolv.conf"):  # the machine's may name 127.0.0.53
                _check(self._libc.mount(os.fsencode(resolv), b"/etc/resolv.conf", None, MS_BIND, None),
                       f"binding {resolv} over /etc/resolv.conf")
            if net is not None:
                self._wire(*net)

    def _wire(self, address: str, host_end: str) -> None:
        self.bridge.wire(address, host_end, self._host_netlink)

    def _leave(self, home_mnt: int, home_uts: int) -> None:
        _check(self._libc.setns(home_mnt, CLONE_NEWNS), "returning to the server's mount namespace")
        _check(self._libc.setns(home_uts, CLONE_NEWUTS), "returning to the server's UTS namespace")
        if self.bridge is not None:
            _check(self._libc.setns(self._home_net, CLONE_NEWNET), "returning to the server's network namespace")

    def _come_back(self, home_mnt: int, home_uts: int) -> None:
        try:
            self._leave(home_mnt, home_uts)
        except OSError as exc:  # stuck in an attempt's namespaces: no start may be made from here again
            self.broken = f"the namespace thread could not return to the server's namespaces ({exc})"
