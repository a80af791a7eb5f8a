"""Where corral keeps its state and how it is reached: ``CORRAL_HOME`` (default
``~/.corral``) with the SQLite database, logs, ``config.yaml`` and ``server.json``;
``CORRAL_DB_URL`` for a shared PostgreSQL; ``CORRAL_SERVER`` for a remote API."""

from __future__ import annotations

import os
from pathlib import Path


_PRIVATE: dict[str, bool] = {}  # a directory checked (or made) private once per process
# What "private" closes: everything for others, except that a root server's jobs, which run as
# their submitters' accounts, may pass through (never list) its directories (auth.accounts).
_CLOSED = 0o066 if os.geteuid() == 0 else 0o077


def private_dir(path: Path) -> bool:
    """Whether ``path`` is (or could be made) a directory of this user's alone: made 0700 if
    missing; an existing one is used only if it is a real directory (not a symlink) owned by
    this user, and made private. False when anyone else owns it: a shared location (like
    /dev/shm) where another user could have planted it, with links to a victim's files."""
    key = str(path)
    if key not in _PRIVATE:
        _PRIVATE[key] = _make_private(path)
    return _PRIVATE[key]


def _make_private(path: Path) -> bool:
    import stat

    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)  # never follows a link
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        if info.st_mode & _CLOSED:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_uid != os.getuid():
                    return False
                os.fchmod(fd, 0o700 | (info.st_mode & 0o011 & ~_CLOSED))
            finally:
                os.close(fd)
    except OSError:
        return False
    return True


class Settings:
    """Where this corral's state lives and how often its loop looks. A plain class, not a
    dataclass: ``dataclasses`` imports ``inspect``, a tenth of every CLI command's start-up."""

    __slots__ = ("home", "db_url", "server_url", "poll_interval_s", "rescan_interval_s", "min_cycle_interval_s")

    def __init__(self, home: Path, db_url: str, server_url: str | None = None,
                 poll_interval_s: float = 0.5,  # safety net; the loop is woken by events first
                 rescan_interval_s: float = 1.0,  # how often the loop re-reads pending jobs and cancels
                 min_cycle_interval_s: float = 0.04):  # a busy loop batches what arrives within this window
        self.home, self.db_url, self.server_url = home, db_url, server_url
        self.poll_interval_s, self.rescan_interval_s = poll_interval_s, rescan_interval_s
        self.min_cycle_interval_s = min_cycle_interval_s

    def __repr__(self) -> str:
        return f"Settings(home={str(self.home)!r}, db_url={self.db_url!r}, server_url={self.server_url!r})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env.get("CORRAL_HOME") or Path.home() / ".corral").expanduser().resolve()
        db_url = env.get("CORRAL_DB_URL") or f"sqlite:///{home / 'corral.db'}"
        return cls(home=home, db_url=db_url, server_url=env.get("CORRAL_SERVER") or None)

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def log_file(self, job_id: int, label: str) -> Path:
        """Where a replica's log is kept on the server, whatever infra it runs on (the one rule:
        ``corral logs``, the API and every executor use it; an executor whose nodes are
        elsewhere mirrors the log here)."""
        return self.logs_dir / str(job_id) / f"{label}.log"

    @property
    def runs_dir(self) -> Path:
        """Per-replica bookkeeping of the local executor (pid and exit files)."""
        return self.home / "runs"

    @property
    def runtime_dir(self) -> Path:
        """Per-job discovery files (hosts, peers.json), rewritten often: on tmpfs when the
        machine has one (a rename over an existing file on ext4 costs ~1 ms), else under
        CORRAL_HOME. One directory per CORRAL_HOME, so several homes never collide."""
        explicit = os.environ.get("CORRAL_RUNTIME_DIR")
        if explicit:
            return Path(explicit)
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            import hashlib

            mine = shm / f"corral-{os.getuid()}"
            if private_dir(mine):  # else another user made it first: never write through it
                return mine / hashlib.sha1(str(self.home).encode()).hexdigest()[:12]
        return self.home / "run"

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def server_file(self) -> Path:
        return self.home / "server.json"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"

    def drop_runtime_dir(self) -> None:
        """At a server's stop: its discovery directory goes if no job's files are left in it
        (only the batch-script shims, made again at the next start), so stopped homes leave
        nothing on tmpfs. A job whose replicas outlive the server keeps it."""
        path = self.runtime_dir
        try:
            left = [p.name for p in path.iterdir()]
        except OSError:
            return
        if set(left) <= {"slurm-bin"}:
            import shutil

            shutil.rmtree(path / "slurm-bin", ignore_errors=True)
            try:
                path.rmdir()
            except OSError:
                pass

    def ensure_dirs(self) -> None:
        """CORRAL_HOME and everything corral keeps in it are its owner's alone: the database
        holds jobs' ``secrets``, logs may print them."""
        for path in (self.home, self.logs_dir, self.runs_dir, self.checkpoints_dir, self.runtime_dir):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in (self.home, self.runtime_dir):
            try:
                os.chmod(path, 0o700 | (os.stat(path).st_mode & 0o011 & ~_CLOSED))
            except OSError:
                pass

