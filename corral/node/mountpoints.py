"""Mount points for a replica's binds (``corral.node.binds``), made and checked as the job's
Unix account: where a ``file_mounts`` target does not exist yet, an empty directory or file is
made for it with the account's rights (never root's: root would create inside a directory the
account may not write), and each source's identity is taken as the account reaches it, so root
then binds only what the account itself may read."""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path

from corral.node.mounts import MountError, _me


def mount_points(wanted: list[tuple[str, str, str]], me: str = "") -> list[dict]:
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
                readable = os.access(source, os.R_OK | (os.X_OK if os.path.isdir(source) else 0), effective_ids=True)
            except OSError as exc:
                info, readable, why = None, False, exc.strerror
            if info is None or not readable:
                raise MountError(f"file_mounts.{remote}: the Unix account {me or _me()} cannot read {source} on this node"
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
                raise MountError(f"file_mounts.{remote}: the Unix account {me or _me()} cannot create {exc.filename or target}"
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

    In a child forked from this process that takes the account's effective uid without exec:
    a change of credentials leaves it undumpable, and its real uid stays root's, so the account
    can neither trace it, write into its memory nor stop it (a program it execs would be the
    account's to forge: what it reports, the source's identity and what it made, by which root
    binds and removes). What it made is checked again here: the target and directories above
    it, nothing else."""
    if account is None:
        return mount_points(wanted)
    # (named here: a lookup in the passwd database after the fork of a threaded server could
    # wait on a lock some other thread held at the fork, in the child, for ever)
    me = getattr(account, "name", "") or str(account.uid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: only system calls and this module's code, then _exit)
        code = 1
        try:
            os.close(read)
            os.setgroups(list(account.groups))
            os.setresgid(account.gid, account.gid, account.gid)
            # the account's rights for every file it touches (the effective uid), yet not the
            # account's to signal (its real and saved uids stay root's): stopped, it would hold
            # the server's start for as long as the deadline below
            os.setresuid(-1, account.uid, -1)
            os.chdir("/")
            try:
                data = json.dumps({"found": mount_points(wanted, me)}).encode()
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
