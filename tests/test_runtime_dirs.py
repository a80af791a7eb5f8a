"""Runtime directories in shared places (/dev/shm) are used only when they are this user's
own: another local user who makes ``/dev/shm/corral-<uid>`` first (world-writable, with
links to a victim's files inside) must not get the server to write through it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral import settings as settings_module
from corral.settings import Settings, _make_private

NOBODY = 65534


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another user owns needs root")


def test_a_directory_someone_else_owns_is_refused(tmp_path: Path) -> None:
    _needs_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, NOBODY, NOBODY)
    assert not _make_private(theirs)
    assert os.stat(theirs).st_uid == NOBODY  # left alone


def test_a_link_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    assert not _make_private(link)


def test_ones_own_directory_is_made_private(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o777)
    os.chmod(mine, 0o777)
    assert _make_private(mine)
    # a root server's jobs run as other accounts, which may pass through (never list or write)
    assert os.stat(mine).st_mode & 0o777 == (0o711 if os.geteuid() == 0 else 0o700)
    fresh = tmp_path / "fresh"
    assert _make_private(fresh) and os.stat(fresh).st_mode & 0o777 == 0o700


def test_the_server_falls_back_to_its_home_when_shm_is_taken(tmp_path: Path, monkeypatch) -> None:
    _needs_root()
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    uid = 40000 + os.getpid() % 20000  # a uid whose /dev/shm entry this test may make
    planted = Path(f"/dev/shm/corral-{uid}")
    planted.mkdir(mode=0o777, exist_ok=True)
    os.chown(planted, NOBODY, NOBODY)
    victim = tmp_path / "victim-file"
    victim.write_text("precious\n")
    monkeypatch.setattr(settings_module.os, "getuid", lambda: uid)
    monkeypatch.setattr(settings_module, "_PRIVATE", {})
    monkeypatch.delenv("CORRAL_RUNTIME_DIR", raising=False)
    try:
        home = tmp_path / "home"
        settings = Settings(home=home, db_url="sqlite://")
        assert settings.runtime_dir == home / "run"
        settings.ensure_dirs()
        assert victim.read_text() == "precious\n"
    finally:
        for entry in planted.iterdir():
            entry.unlink()
        planted.rmdir()


def test_a_stopped_server_leaves_its_runtime_directory_only_to_jobs_still_running(tmp_path: Path) -> None:
    """Homes come and go (every test makes one): a server that stops takes its discovery
    directory on tmpfs with it, unless replicas that outlive it still read their files there."""
    from conftest import cli_for, cli_status, wait_for

    home = tmp_path / "home"
    home.mkdir()
    corral = cli_for(home, cwd=tmp_path)
    runtime = Settings(home=home, db_url="sqlite://").runtime_dir
    (tmp_path / "short.yaml").write_text("name: short\nrun: echo hi\n")
    (tmp_path / "long.yaml").write_text("name: long\nrun: exec sleep 300\n")
    try:
        corral("launch", "short.yaml", check=True)
        assert runtime.is_dir()
        corral("server", "stop", check=True)
        assert not runtime.exists()
        job = corral("launch", "-d", "long.yaml", check=True).stdout.strip()
        wait_for(lambda: cli_status(corral, job)["state"] == "RUNNING", timeout=30)
        corral("server", "stop", check=True)
        assert (runtime / job / "hosts").exists()  # its replica still runs, and reads them
        corral("cancel", job, check=True)
    finally:
        corral.stop()
