"""The small files an attempt's run directory holds (``started``, ``exit_code``, a pull's
``reason``, the GPUs its step was given …), read by the server although the job's Unix account
may write them: a Slurm step of another account records its start and exit there as that
account, so the directory is the account's, and whatever it puts there is read with root's
rights. ``read_small`` reads only a regular file of one link, never through a symbolic link
(a link to ``/etc/shadow`` would become the job's failure reason), never blocking on a pipe (a
fifo named ``exit_code`` held the server's watch thread), and only its first few KB."""

from __future__ import annotations

import os
import stat
from pathlib import Path

LIMIT = 4096


def read_small(path: Path | str, limit: int = LIMIT) -> str | None:
    """The file's first ``limit`` bytes as text, or None where there is no such regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
