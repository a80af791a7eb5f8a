"""The server reads an attempt's small files (start, exit, a pull's reason, a staging failure,
its step's GPUs) in a directory the job's account may write: never through a link, never
blocking on a pipe, never more than a few KB (``corral.node.runfiles``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corral.node import container
from corral.node.runfiles import LIMIT, read_small
from corral.node.runner import EXIT_FILE, STARTED_FILE, NodeRunner
from corral.node.staging import STAGE_FAILED, stage_failure


def _in_time(call, seconds: float = 5.0):  # noqa: ANN001, ANN202 - what a blocked read would hang
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"{call} did not return within {seconds}s"
    return out[0]


@pytest.fixture
def attempt(tmp_path: Path):
    runner = NodeRunner(tmp_path / "runs", tmp_path / "rt", "runfiles-test")
    run_dir = runner.run_dir("k1")
    run_dir.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("ROOT-ONLY-7f3a\n")
    return runner, run_dir, secret


def test_a_link_to_another_file_is_not_read_through(attempt) -> None:
    runner, run_dir, secret = attempt
    for name in (container.REASON_FILE, STAGE_FAILED, container.NAME_FILE, EXIT_FILE, STARTED_FILE):
        (run_dir / name).symlink_to(secret)
    assert container.pull_failure(run_dir) == ""
    assert stage_failure(run_dir) == ""
    assert container.named(run_dir) is None
    assert runner.exit_code("k1") is None and runner.started_pid("k1") is None
    for name in (EXIT_FILE, STAGE_FAILED):  # nor through a hard link (a file of two names)
        (run_dir / name).unlink()
        os.link(secret, run_dir / name)
    assert stage_failure(run_dir) == "" and runner.exit_code("k1") is None


def test_a_pipe_does_not_block_the_reader(attempt) -> None:
    runner, run_dir, _ = attempt
    for name in (EXIT_FILE, STARTED_FILE, container.REASON_FILE, STAGE_FAILED, container.SCRIPT_FILE):
        os.mkfifo(run_dir / name)
    assert _in_time(lambda: runner.exit_code("k1")) is None
    assert _in_time(lambda: runner.started_pid("k1")) is None
    assert _in_time(lambda: container.pull_failure(run_dir)) == ""
    assert _in_time(lambda: stage_failure(run_dir)) == ""
    assert _in_time(lambda: container.pulling(run_dir)) is False


def test_what_is_there_is_read_as_before_and_no_more_than_a_few_kb(attempt) -> None:
    runner, run_dir, _ = attempt
    (run_dir / EXIT_FILE).write_text("3\n")
    (run_dir / STARTED_FILE).write_text("4242\n")
    (run_dir / container.REASON_FILE).write_text("manifest unknown\n")
    (run_dir / STAGE_FAILED).write_text("x" * (10 * LIMIT))
    assert runner.exit_code("k1") == 3 and runner.started_pid("k1") == 4242
    assert container.pull_failure(run_dir) == "image pull failed: manifest unknown"
    assert len(stage_failure(run_dir)) == LIMIT
    assert read_small(run_dir / "absent") is None


def test_a_process_of_another_account_that_looks_like_a_staging_srun_is_not_adopted(tmp_path: Path) -> None:
    """After a restart, attempts are found by their srun's step name: only among the server's
    own processes (anyone may start one whose arguments look alike)."""
    from corral.executors.slurm.cli import srun_clients

    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another account")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from unix_users import unix_user

    with unix_user("rfspoof") as other:
        proc = subprocess.Popen(["sh", "-c", "sleep 60; :", "stage", "/r", "--", "srun", "--jobid=1",
                                 "--job-name=corral-test-spoof-k1"], user=other.uid, group=other.gid, cwd="/")
        mine = subprocess.Popen(["sh", "-c", "sleep 60; :", "stage", "/r", "--", "srun", "--jobid=1",
                                 "--job-name=corral-test-mine-k1"], cwd="/")
        try:
            time.sleep(0.5)  # their command lines are in place
            found = srun_clients()
            assert "corral-test-mine-k1" in found and "corral-test-spoof-k1" not in found, found
        finally:
            for each in (proc, mine):
                each.kill()
                each.wait()
