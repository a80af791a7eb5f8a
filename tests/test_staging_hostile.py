"""Hostile cases of Slurm's file_mounts staging (``corral.node.staging``): what a job's account
controls (its run directory, its sources) must neither make the root server read a file for it
nor let a copy grow past ``infra.slurm.file_mounts_max_gb``, nor hang the stager."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from pathlib import Path

import pytest

from corral.node.staging import STAGE_FAILED, stage_failure


@pytest.fixture
def private(tmp_path: Path):
    """A directory on a tmpfs (/dev/shm), a device other than the record's: staged."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm, a tmpfs, on a device of its own")
    path = Path("/dev/shm") / f"corral-stage-hostile-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_failure_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    """The run directory is the job's account's: its mounts.err made a link to a file of root's
    (/etc/shadow) would be read by the root server and shown as the job's reason."""
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash:19000::::::\n")
    secret.chmod(0o600)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STAGE_FAILED).symlink_to(secret)
    assert stage_failure(run_dir) == ""


def test_a_failure_file_that_is_a_hard_link_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.link(secret, run_dir / STAGE_FAILED)
    assert stage_failure(run_dir) == ""


def test_a_failure_file_that_is_a_fifo_does_not_hang_the_server(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / STAGE_FAILED)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(stage_failure(run_dir)), daemon=True)
    reader.start()
    reader.join(3)
    if reader.is_alive():  # (unblock it: a writer opens the fifo)
        os.close(os.open(run_dir / STAGE_FAILED, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(3)
        pytest.fail("stage_failure blocked on a fifo")
    assert said == [""]


def test_a_huge_failure_file_is_read_only_in_part(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STAGE_FAILED).write_text("file_mounts./x: why " + "x" * (4 << 20))
    assert 0 < len(stage_failure(run_dir)) <= 4096


def test_a_failure_file_as_written_is_read(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / STAGE_FAILED).write_text("file_mounts./x: it is too large\n")
    assert stage_failure(run_dir) == "file_mounts./x: it is too large"
    assert stage_failure(tmp_path / "absent") == ""
