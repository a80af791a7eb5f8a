"""Throwaway Unix accounts for tests of who a job runs as: made with ``useradd`` under a
unique name (with a supplementary group of their own, so ``initgroups`` is visible) and
removed with ``userdel`` afterwards. Only root can make them; ``need_root`` skips otherwise.
On a Slurm lab that enforces associations, ``slurm_association`` lets such a user submit
(added to the first account root's association names, removed afterwards)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class ThrowawayUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # every group id, the primary one first
    home: str


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("making throwaway Unix accounts (useradd) needs root; run as root to check who jobs run as")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("useradd and setpriv are needed to check who jobs run as")


def _accounts(*argv: str, check: bool = False) -> subprocess.CompletedProcess:
    """useradd, userdel, groupadd or groupdel, one at a time on this machine: each takes the
    account files' lock and gives up at once ("cannot lock /etc/passwd") when another holds
    it, as happens when tests run in parallel (pytest-xdist)."""
    import fcntl

    with open("/tmp/corral-tests-accounts.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(list(argv), check=check, capture_output=True)


@contextmanager
def unix_user(prefix: str = "cid") -> Iterator[ThrowawayUser]:
    """A new Unix account with its own home and an extra group; removed on exit."""
    need_root()
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    extra = f"{name}x"
    _accounts("groupadd", extra, check=True)
    try:
        _accounts("useradd", "-m", "-U", "-G", extra, "-s", "/bin/bash", name, check=True)
        try:
            import pwd

            entry = pwd.getpwnam(name)
            groups = (entry.pw_gid, *sorted(g for g in os.getgrouplist(name, entry.pw_gid) if g != entry.pw_gid))
            yield ThrowawayUser(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)
        finally:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)  # only this throwaway account's
            _accounts("userdel", "-r", name)
    finally:
        _accounts("groupdel", extra)


@contextmanager
def traversable_dir() -> Iterator[Path]:
    """A directory others may pass through (not list), for a corral home whose jobs run as
    other accounts (pytest's own temporary directories are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-identity-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def slurm_association(user: str, env: dict[str, str]) -> Iterator[None]:
    """Let ``user`` submit to a Slurm that enforces associations; undone on exit."""
    run = lambda *argv: subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)  # noqa: E731
    accounts = run("sacctmgr", "-n", "-P", "show", "assoc", "user=root", "format=account").stdout.split()
    if not accounts:
        yield
        return
    run("sacctmgr", "-i", "add", "user", user, f"account={accounts[0]}")
    try:
        yield
    finally:
        # Slurm keeps an association while its user has jobs: end this throwaway user's (only theirs)
        run("scancel", "-u", user)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not run("squeue", "-h", "-u", user).stdout.strip():
                run("sacctmgr", "-i", "delete", "user", user)
                if not run("sacctmgr", "-n", "-P", "show", "user", user).stdout.strip():
                    break
            time.sleep(2)
