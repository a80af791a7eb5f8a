"""Hostile cases of Slurm's file_mounts staging (``corral.node.staging``): what a job's account
controls (its run directory, its sources) must neither make the root server read a file for it
nor let a copy grow past ``infra.slurm.file_mounts_max_gb``, nor hang the stager."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from corral.node.mounts import MountError, copy_dir, staged
from corral.node.staging import STAGE_FAILED, stage, stage_failure


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


def test_a_source_that_grows_while_it_is_copied_stops_at_the_limit(tmp_path: Path, private: Path) -> None:
    """The size is checked before the copy: a file still being written (a log, or one the
    account appends to on purpose) must not fill corral's home past the limit."""
    src = private / "growing.log"
    src.write_bytes(b"x" * 1000)
    record = tmp_path / "mounts" / "3"
    record.mkdir(parents=True)
    limit = 64 << 10
    stop = threading.Event()

    def grow() -> None:
        with open(src, "ab") as out:  # (bounded: 8 MB, some 128 times the limit)
            for _ in range(32):
                if stop.is_set():
                    break
                out.write(b"y" * (256 << 10))
                out.flush()

    import corral.node.staging as staging

    real = staging.size_of
    started = threading.Event()

    def size_then_grow(path: str, bound: int) -> int:  # the check sees 1000 bytes, then it grows
        size = real(path, bound)
        if not started.is_set():
            started.set()
            threading.Thread(target=grow, daemon=True).start()
            time.sleep(0.3)
        return size

    staging.size_of = size_then_grow
    try:
        with pytest.raises(MountError) as said:
            stage(record, [("/logs/x", str(src))], limit)
    finally:
        staging.size_of = real
        stop.set()
    text = str(said.value)
    assert text.startswith("file_mounts./logs/x: ") and "infra.slurm.file_mounts_max_gb" in text, text
    assert not staged(record, str(src))
    copied = copy_dir(record, str(src))
    assert not copied.exists() or copied.stat().st_size <= limit


def test_a_tree_whose_files_grow_past_the_limit_together_is_not_staged(tmp_path: Path, private: Path) -> None:
    src = private / "tree"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(b"z" * 100)
    record = tmp_path / "mounts" / "4"
    record.mkdir(parents=True)
    import corral.node.staging as staging

    real = staging.size_of
    grown = []

    def size_then_grow(path: str, bound: int) -> int:
        size = real(path, bound)
        if not grown:
            grown.append(1)
            for i in range(4):
                (src / f"f{i}").write_bytes(b"z" * 600)  # each under the limit, all four over it
        return size

    staging.size_of = size_then_grow
    try:
        with pytest.raises(MountError, match=r"^file_mounts\./t: "):
            stage(record, [("/t", str(src))], 2000)
    finally:
        staging.size_of = real
    assert not staged(record, str(src))


def test_a_file_swapped_for_a_fifo_after_its_check_does_not_hang_the_stager(tmp_path: Path, private: Path) -> None:
    """A regular file when looked at, a fifo when opened: the copy opens it without blocking
    and copies only what is a regular file then."""
    src = private / "tree"
    src.mkdir()
    (src / "f").write_text("x")
    record = tmp_path / "mounts" / "5"
    record.mkdir(parents=True)
    import corral.node.staging as staging

    real_lstat = os.lstat
    swapped = []

    def lstat_then_swap(path, *args, **kwargs):  # noqa: ANN001, ANN202
        info = real_lstat(path, *args, **kwargs)
        if str(path) == str(src / "f") and not swapped:
            swapped.append(1)
            os.unlink(src / "f")
            os.mkfifo(src / "f")
        return info

    done: list[object] = []

    def run() -> None:
        try:
            done.append(stage(record, [("/t", str(src))], 1 << 20))
        except MountError as exc:
            done.append(exc)

    staging.os.lstat = lstat_then_swap
    try:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(5)
    finally:
        staging.os.lstat = real_lstat
    if worker.is_alive():
        os.close(os.open(src / "f", os.O_WRONLY | os.O_NONBLOCK))  # (unblock it)
        worker.join(5)
        pytest.fail("the stager blocked on a fifo swapped in after its check")
    assert swapped and len(done) == 1 and isinstance(done[0], MountError), done
    assert str(done[0]).startswith("file_mounts./t: "), done[0]


def test_a_socket_or_fifo_in_a_tree_fails_the_step_naming_the_mount(tmp_path: Path, private: Path) -> None:
    import socket

    src = private / "tree"
    src.mkdir()
    (src / "f").write_text("x")
    os.mkfifo(src / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(src / "sock"))
        record = tmp_path / "mounts" / "6"
        record.mkdir(parents=True)
        with pytest.raises(MountError, match=r"^file_mounts\./t: .*neither a file, a directory nor a link"):
            stage(record, [("/t", str(src))], 1 << 20)
        assert not staged(record, str(src)) and not copy_dir(record, str(src)).parent.exists()
    finally:
        sock.close()


def test_a_stager_killed_with_sigkill_leaves_no_child_of_the_account_copying(tmp_path: Path, private: Path) -> None:
    """A cancel during staging SIGKILLs the process that would become the srun (root): its
    child, copying as the account, ends with it (it holds the job's lock, and would go on
    writing into corral's home for a job that has ended)."""
    import fcntl
    import subprocess

    import psutil

    from corral.node.staging import stage_command
    from unix_users import need_root, traversable_dir, unix_user

    need_root()
    with traversable_dir() as root, unix_user("chsk") as ann:
        src = private / "src"
        src.mkdir()
        (src / "f").write_text("x")
        private.chmod(0o755)
        src.chmod(0o755)
        record = root / "mounts" / "11"
        record.mkdir(parents=True)
        os.chown(record, ann.uid, ann.gid)
        lock = record / "lock"  # held here: the child waits on it, as a long copy would keep it busy
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        os.fchown(fd, ann.uid, ann.gid)
        fcntl.flock(fd, fcntl.LOCK_EX)
        argv = stage_command(record, (("/t", str(src)),), 1 << 20, "", "", (ann.uid, ann.gid, tuple(ann.groups)))
        proc = subprocess.Popen(argv + ["--", "true"], start_new_session=True)
        try:
            child = None
            for _ in range(200):
                kids = psutil.Process(proc.pid).children()
                if kids and kids[0].uids().real == ann.uid:
                    child = kids[0]
                    break
                time.sleep(0.05)
            assert child is not None, "no staging child of the account"
            proc.kill()
            proc.wait()
            gone, _ = psutil.wait_procs([child], timeout=5)
            assert gone, f"the account's staging child {child.pid} outlived its parent"
        finally:
            os.close(fd)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_source_that_is_a_link_is_measured_by_what_it_links_to(tmp_path: Path, private: Path, kind: str) -> None:
    """The copy follows a source that is itself a link: so must the size checked against the
    limit (the link's own few bytes let any size through to the copy)."""
    big = private / "big"
    if kind == "file":
        big.write_bytes(b"w" * 3000)
    else:
        big.mkdir()
        (big / "w.bin").write_bytes(b"w" * 3000)
    link = private / "link"
    link.symlink_to(big)
    record = tmp_path / "mounts" / "12"
    record.mkdir(parents=True)
    with pytest.raises(MountError) as said:
        stage(record, [("/opt/big", str(link))], 1024)
    text = str(said.value)
    assert text.startswith(f"file_mounts./opt/big: {link} is 2.9 KB, larger than the 1.0 KB"), text
    assert not copy_dir(record, str(link)).parent.exists()


def test_a_tree_of_many_empty_files_is_bounded_by_the_limit_too(tmp_path: Path, private: Path) -> None:
    """Empty files cost no bytes but an inode each in corral's home (the server's disk): a tree
    of millions of them passed any limit ('0 bytes') and was copied whole."""
    from corral.node.staging import entries_allowed

    src = private / "many"
    src.mkdir()
    limit = 1 << 20
    assert entries_allowed(limit) == 10_000
    for i in range(10_050):
        os.close(os.open(src / str(i), os.O_WRONLY | os.O_CREAT, 0o644))
    record = tmp_path / "mounts" / "13"
    record.mkdir(parents=True)
    with pytest.raises(MountError) as said:
        stage(record, [("/many", str(src))], limit)
    text = str(said.value)
    assert text.startswith(f"file_mounts./many: {src} holds over 10,000 files, directories and links"), text
    assert "infra.slurm.file_mounts_max_gb" in text, text
    assert not copy_dir(record, str(src)).parent.exists()
    for i in range(100):  # under the bound: copied
        (src / str(i)).unlink()
    assert stage(record, [("/many", str(src))], limit) == [str(src)]
    assert len(os.listdir(copy_dir(record, str(src)))) == 9_950


def test_a_tree_given_many_files_while_it_is_copied_stops_at_the_bound(tmp_path: Path, private: Path) -> None:
    import corral.node.staging as staging

    src = private / "many"
    (src / "a").mkdir(parents=True)
    record = tmp_path / "mounts" / "14"
    record.mkdir(parents=True)
    real = staging.entries_in

    def count_then_add(path: str, stop: int) -> int:
        found = real(path, stop)
        for i in range(10_050):  # after the count
            os.close(os.open(src / "a" / str(i), os.O_WRONLY | os.O_CREAT, 0o644))
        return found

    staging.entries_in = count_then_add
    try:
        with pytest.raises(MountError, match=r"^file_mounts\./many: "):
            stage(record, [("/many", str(src))], 1 << 20)
    finally:
        staging.entries_in = real
    assert not copy_dir(record, str(src)).parent.exists()


def test_copies_that_would_fill_corral_s_home_are_refused(tmp_path: Path, private: Path, monkeypatch) -> None:
    """Each job's copy is within the limit, but an array of a thousand elements copies a
    thousand times: the copy that would leave corral's home (the server's disk) with less than
    KEEP_FREE of it free is refused, with a sentence naming the mount."""
    import corral.node.staging as staging

    src = private / "w.bin"
    src.write_bytes(b"w" * 3000)
    record = tmp_path / "mounts" / "15"
    record.mkdir(parents=True)
    real = os.statvfs

    class Full:
        f_frsize, f_blocks, f_bavail = 1024, 100_000, 5_001  # 5,121,024 free, 5,120,000 kept

    monkeypatch.setattr(staging.os, "statvfs", lambda path: Full() if str(path) == str(record) else real(path))
    with pytest.raises(MountError) as said:
        stage(record, [("/w", str(src))], 1 << 20)
    text = str(said.value)
    assert text.startswith(f"file_mounts./w: {src} (2.9 KB) does not fit in corral's home"), text
    assert not staged(record, str(src)) and not copy_dir(record, str(src)).parent.exists()
    Full.f_bavail = 5_010
    assert stage(record, [("/w", str(src))], 1 << 20) == [str(src)]


def test_names_with_newlines_spaces_and_dashes_are_staged_by_the_program(tmp_path: Path, private: Path) -> None:
    import subprocess

    from corral.node.staging import stage_command

    src = private / "a b\n-- srun\n..x"
    src.mkdir()
    (src / "--").write_text("dashes\n")
    (src / "line\nbreak").write_text("nl\n")
    record = tmp_path / "mounts" / "16"
    record.mkdir(parents=True)
    marker = tmp_path / "ran"
    argv = stage_command(record, (("/in put", str(src)), ("~/--", str(src / "--"))), 1 << 20, "", "", None)
    done = subprocess.run(argv + ["--", "touch", str(marker)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and marker.exists(), done.stderr
    copy = copy_dir(record, str(src))
    assert (copy / "--").read_text() == "dashes\n" and (copy / "line\nbreak").read_text() == "nl\n"
    assert copy_dir(record, str(src / "--")).read_text() == "dashes\n"
