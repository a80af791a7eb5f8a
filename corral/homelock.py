"""Which process serves a CORRAL_HOME: the one holding the flock on ``server.lock`` there, with
its pid written inside. One rule for both sides: the server takes the lock before anything
else (a second server of the home exits), and ``corral server status``, ``start`` and every
command that finds the embedded server ask who holds it, so what ``status`` says is what the
next command finds (a server still starting holds the home before it answers; a
``server.json`` left by a server that died holds nothing)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

TAKE_WAIT_S = 1.0  # a command asking who holds the lock holds it shared for an instant: wait that out


def lock_path(home: Path) -> Path:
    return home / "server.lock"


def take(home: Path, wait: float = TAKE_WAIT_S) -> IO[str] | None:
    """The home's lock, held (the file open) until this process ends, with our pid inside; None
    if another server holds it."""
    handle = open(lock_path(home), "a+")  # never truncated before it is ours: the holder's pid stays
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                return None
            time.sleep(0.02)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def holder(home: Path) -> int | None:
    """The pid of the server holding the home (0 when it has not written it yet), or None when
    no process holds it."""
    try:
        handle = open(lock_path(home))
    except FileNotFoundError:
        return None
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
