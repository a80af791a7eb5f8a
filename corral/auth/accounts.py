"""Which Unix account a job runs as, and the files that account is handed.

A request's identity (the server's owner through the local token, or a token's user) maps to
a Unix account: the account of the same name, unless ``config.yaml`` maps it
(``identity: {unix_accounts: {ann: ann_hpc}}``). The account is fixed at submission, stored
with the job (``jobs.run_as``) and looked up again in the passwd database when a replica
starts, as a login would (uid, primary group, supplementary groups, home, shell).

* A server running as root starts every replica as its job's account.
* A server running as anyone else can start processes only as itself: it accepts the jobs of
  users whose account is its own and refuses the others at submission,
* unless the operator declares the server's account a shared service account
  (``identity: {service_account: NAME}``, NAME being the server's own account): then every
  user's job runs as that one account, root or not, and every job can read what the server
  can (CORRAL_HOME, its local token): only for a team that trusts each other's jobs as it
  trusts the server.
* An infra whose workers all run as one account (a Ray cluster) accepts only that account's
  jobs (``Infra.runs_as``).

Refusals are one sentence naming the user and the account (``AccountRefusal``).

What a job's account can reach of the server's files is decided here too (``hand_over``,
``open_for_jobs``): directories on the way to what a replica must use (its checkpoint
directory, its log, the discovery files) are traversable (0711: no listing), the job's own
directory belongs to its account, and everything else (the database, the local token, other
jobs' logs) stays the server's alone (0600/0700)."""

from __future__ import annotations

import getpass
import os
import pwd
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field

from corral.spec.base import Strict

_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$"  # a portable Unix user name


class IdentityConfig(Strict):
    """``identity:`` in config.yaml: which Unix account each corral user's jobs run as."""

    # corral user (a token's user) -> Unix account; a user not listed runs as the account of
    # the same name
    unix_accounts: dict[str, Annotated[str, Field(pattern=_NAME)]] = Field(default_factory=dict)
    # the server's own account, declared shared: the server runs every user's jobs as it (they
    # can read each other's files and the server's home, its local token included)
    service_account: str | None = Field(default=None, pattern=_NAME)


class AccountRefusal(Exception):
    """A submission whose user cannot run here as a Unix account; the message is one sentence."""


@dataclass(frozen=True)
class UnixAccount:
    """A Unix account as a login sets it up: what a replica is started as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups (initgroups), the primary one included
    home: str
    shell: str

    @classmethod
    def lookup(cls, name: str) -> UnixAccount | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        try:
            groups = tuple(os.getgrouplist(name, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/", entry.pw_shell or "/bin/sh")

    def env(self) -> dict[str, str]:
        """The variables a login sets for this account."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}


# A login's umask: files a replica creates are readable by others, as under a user's shell
# or sbatch, never the server's own private 077.
LOGIN_UMASK = 0o022


def server_account() -> str:
    """The account this process runs as (by uid, not the spoofable USER variables)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return getpass.getuser()


class Accounts:
    """The mapping of corral users to Unix accounts on this server, and its refusals."""

    def __init__(self, config: IdentityConfig, server: str | None = None, root: bool | None = None):
        self.config = config
        self.server = server if server is not None else server_account()
        self.root = (os.geteuid() == 0) if root is None else root
        if config.service_account is not None and config.service_account != self.server:
            raise ValueError(f"identity.service_account is {config.service_account!r} but this server runs as "
                             f"{self.server!r}: a shared service account is the server's own account")

    def mapped(self, user: str) -> str:
        return self.config.unix_accounts.get(user, user)

    def run_as(self, user: str, only: str | None = None, where: str = "") -> str:
        """The Unix account ``user``'s job runs as; ``only``: the one account the job's infra
        runs everything as (``where`` names it). Raises ``AccountRefusal`` with a sentence."""
        if self.config.service_account is not None:
            name = self.server  # every user's job runs as the declared shared account, the server's
        elif not self.root:
            name = self.mapped(user)
            if name != self.server:
                raise AccountRefusal(
                    f"this corral server runs as {self.server}, not root, so it can start jobs only as "
                    f"{self.server}, and {user}'s jobs run as the Unix account {name}: run the server as "
                    f"root, or declare {self.server} a shared service account (config.yaml identity: "
                    f"service_account: {self.server})")
        else:
            name = self.mapped(user)
            if UnixAccount.lookup(name) is None:
                how = "" if name == user else f" (config.yaml identity.unix_accounts maps it to {name})"
                raise AccountRefusal(
                    f"user {user} has no Unix account on this server: there is no account {name!r}{how}; "
                    f"an admin creates it or maps {user} to one in config.yaml identity: unix_accounts")
        if only is not None and name != only:
            raise AccountRefusal(f"{where or 'this partition'} runs every job as the Unix account {only} (its "
                                 f"workers' user), and {user}'s jobs run as {name}: submit to another partition")
        return name

@lru_cache(maxsize=1)
def _this_process() -> tuple[str, bool]:
    return server_account(), os.geteuid() == 0


def account_to_start(name: str | None) -> UnixAccount | None:
    """The account to start a job's replica as, looked up now as a login would: None when it
    is this process's own (nothing to switch; also a job stored before accounts, and any job
    of a server that is not root, which accepted only its own account's or shares it). Raises
    ``LookupError`` with a sentence for an account removed since the job was submitted."""
    own, root = _this_process()
    if name is None or name == own or not root:
        return None
    account = UnixAccount.lookup(name)
    if account is None:
        raise LookupError(f"the Unix account {name} this job runs as no longer exists on this server")
    return account


# -- files a job's account is handed ------------------------------------------------------------

def _traversable(path: Path) -> None:
    """Let others pass through ``path`` (x) without listing it; only a real directory of ours."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and (info.st_mode & 0o011) != 0o011:
        os.chmod(path, (info.st_mode & 0o7777) | 0o011)


def hand_over(path: Path, account: UnixAccount | None, base: Path, directory: bool = True) -> None:
    """Make ``path`` (under ``base``) exist and belong to ``account``, private to it (0700 for a
    directory, 0600 for a file), with ``base`` and the directories between traversable. A file
    is created without following links, in a directory of the server's, so nothing the account
    controls redirects the server's writes. Nothing to do without an account (the server's own)."""
    if directory:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    if account is None:
        return
    at = path.parent
    chain = []
    while at != base and base in at.parents:
        chain.append(at)
        at = at.parent
    for directory_on_way in [base, *reversed(chain)]:
        _traversable(directory_on_way)
    info = os.lstat(path)
    if info.st_uid == account.uid and info.st_gid == account.gid:
        return
    if stat.S_ISLNK(info.st_mode):
        raise OSError(f"{path} is a symbolic link: not handed over")
    os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(path, 0o700 if stat.S_ISDIR(info.st_mode) else 0o600)


def open_for_jobs(*directories: Path, private: tuple[Path, ...] = ()) -> None:
    """A root server's home, and the directories of it jobs' files live in, made traversable
    (0711) so a job's account reaches its own files by path; what lies in them stays private
    (the server's umask is 077), and the ``private`` files that may have been made with
    another umask (the server's log, which the CLI opens) are made the server's alone."""
    if os.geteuid() != 0:
        return
    for directory in directories:
        _traversable(directory)
    for path in private:
        try:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)
        except FileNotFoundError:
            continue


def open_discovery(runtime_dir: Path, job_dir: Path) -> None:
    """Let a replica of another account read its job's discovery files (hosts, peers.json:
    names and addresses, no secrets) by path; the directories are traversable, never listable."""
    job_dir.mkdir(parents=True, exist_ok=True)
    open_for_jobs(runtime_dir.parent, runtime_dir, job_dir, runtime_dir / "slurm-bin")  # + batch scripts' srun
    peers_readable(job_dir)


def peers_readable(job_dir: Path) -> None:
    """peers.json is written with the server's private umask: readable by the job's replicas."""
    if os.geteuid() == 0:
        try:
            os.chmod(job_dir / "peers.json", 0o644)
        except FileNotFoundError:
            pass


# -- what a job's account may read ----------------------------------------------------------

_CAN_READ = ('for p; do if [ -d "$p" ]; then { [ -r "$p" ] && [ -x "$p" ]; } || printf "%s\\0" "$p"; '
             'else [ -r "$p" ] || printf "%s\\0" "$p"; fi; done')


def unreadable_as(name: str | None, paths: list[str]) -> list[str]:
    """The ``paths`` the Unix account ``name`` could not read (a directory: read and enter),
    asked of the kernel by a process of that account: a root server never reads a file on an
    account's behalf with its own rights. The server's own account (or a server that is not
    root, whose jobs run as itself) is asked in this process."""
    own, root = _this_process()
    if name is None or name == own or not root:
        return [p for p in paths if not os.access(p, os.R_OK | (os.X_OK if os.path.isdir(p) else 0))]
    account = UnixAccount.lookup(name)
    if account is None:
        return list(paths)
    import subprocess

    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", _CAN_READ, "corral-can-read", *paths],
                          user=account.uid, group=account.gid, extra_groups=list(account.groups), cwd="/",
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=30)
    if done.returncode != 0:
        return list(paths)
    return [p for p in done.stdout.decode(errors="surrogateescape").split("\0") if p]
