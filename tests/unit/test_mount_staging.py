"""file_mounts on Slurm nodes that do not see a source (``corral.node.staging``): which
sources are staged (by the filesystem holding them), the copy made once per job into the job's
record, as the job's account, within the limit, the program that stages then becomes the
step's srun, and a node preferring the job's complete copy over what it has at the path."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from corral.node.mounts import COMPLETE, RECORD, MountError, attach, copy_dir, detach, here, seen_at, staged
from corral.node.staging import SHARED_FS, fs_type, must_stage, oversized, stage, stage_command, stage_failure

MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:40 / /shared rw,relatime shared:7 - nfs4 fs:/export rw,vers=4.2
31 22 0:41 / /scratch rw - lustre 10.0.0.1@tcp:/scratch rw
32 22 0:42 / /gluster rw shared:9 master:3 - fuse.glusterfs g:/vol rw
33 22 0:43 / /tmp/private rw - tmpfs tmpfs rw
34 33 0:44 / /tmp/private/deeper rw - nfs fs:/x rw
35 22 0:45 / /with\\040space rw - nfs4 fs:/y rw
36 22 0:46 / /shared rw - tmpfs tmpfs rw
37 22 0:47 / /vm rw - virtiofs share rw
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/home/u/data", "ext4"),
    ("/scratch/run/1", "lustre"),
    ("/gluster/x", "fuse.glusterfs"),
    ("/tmp/private/x", "tmpfs"),
    ("/tmp/private/deeper/x", "nfs"),   # the deepest mount above it
    ("/tmp/privateer", "ext4"),         # a sibling of a mount point is not in it
    ("/with space/f", "nfs4"),          # mountinfo's escapes
    ("/shared/a", "tmpfs"),             # the last mount at a point hides the earlier one
    ("/vm/a", "virtiofs"),
])
def test_the_filesystem_holding_a_path_is_its_deepest_mount(path: str, kind: str) -> None:
    assert fs_type(path, MOUNTINFO) == kind


def test_what_is_staged_is_what_neither_corral_s_home_s_device_nor_a_shared_filesystem_holds(tmp_path: Path) -> None:
    source = tmp_path / "s"
    source.write_text("x")
    here_dev = os.stat(tmp_path).st_dev
    assert not must_stage(str(source), here_dev)  # on the device of corral's home: the nodes see it
    local = f"22 1 0:1 / {tmp_path} rw - ext4 /dev/sdb rw\n"
    assert must_stage(str(source), here_dev + 1, local)  # another, local device: staged
    for kind in ("nfs4", "lustre", "gpfs", "beegfs", "ceph", "fuse.glusterfs"):
        assert kind in SHARED_FS
        assert not must_stage(str(source), here_dev + 1, local.replace("ext4", kind))
    for kind in ("tmpfs", "overlay", "xfs", "9p", "virtiofs", "fuse.sshfs"):  # (the debatable ones staged)
        assert must_stage(str(source), here_dev + 1, local.replace("ext4", kind))
    with pytest.raises(OSError):
        must_stage(str(tmp_path / "absent"), here_dev + 1, local)


def _copies(record: Path) -> list[dict]:
    lines = (record / RECORD).read_text().splitlines() if (record / RECORD).exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == "copy"]


def test_a_source_the_nodes_may_not_see_is_staged_once_per_job_and_goes_with_it(tmp_path: Path,
                                                                               private: Path) -> None:
    src = private / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "a.txt").write_text("shard\n")
    (src / "data" / "link").symlink_to("a.txt")
    (src / "cfg.txt").write_text("lr: 0.1\n")
    record = tmp_path / "home" / "mounts" / "7"
    record.mkdir(parents=True)
    mounts = [("/data", str(src / "data")), ("/cfg.txt", str(src / "cfg.txt"))]
    done = []
    threads = [threading.Thread(target=lambda: done.append(stage(record, mounts, 1 << 20)))
               for _ in range(4)]  # replicas starting together
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(s for copied in done for s in copied) == sorted(s for _, s in mounts)  # each copied once
    assert len(_copies(record)) == 2
    data = copy_dir(record, str(src / "data"))
    assert (data / "a.txt").read_text() == "shard\n" and os.readlink(data / "link") == "a.txt"
    assert copy_dir(record, str(src / "cfg.txt")).read_text() == "lr: 0.1\n"
    assert staged(record, str(src / "data")) and (data.parent / COMPLETE).exists()
    assert stage(record, mounts, 1 << 20) == []  # a later replica: nothing more
    assert os.readlink(seen_at(record, str(src / "data"))) == str(data)  # what a container binds
    detach(record)
    assert not record.exists()  # the job ended: its copies with its record


def test_a_source_the_nodes_see_is_not_staged(tmp_path: Path) -> None:
    src = tmp_path / "cfg.txt"
    src.write_text("x")
    record = tmp_path / "mounts" / "1"
    record.mkdir(parents=True)
    assert stage(record, [("/cfg", str(src))], 1 << 20) == []  # the device of the record: seen by the nodes
    assert not staged(record, str(src)) and _copies(record) == []
    assert os.readlink(seen_at(record, str(src))) == str(src)  # a container binds the path as its node has it


def test_a_source_over_the_limit_is_not_staged_and_the_sentence_says_mount_size_and_limit(tmp_path: Path,
                                                                                          private: Path) -> None:
    big = private / "big"
    big.mkdir()
    (big / "w.bin").write_bytes(b"\0" * 3000)
    record = tmp_path / "mounts" / "2"
    record.mkdir(parents=True)
    with pytest.raises(MountError) as said:
        stage(record, [("/opt/big", str(big))], 1024)
    text = str(said.value)
    assert text.startswith("file_mounts./opt/big: ") and "2.9 KB" in text and "1.0 KB" in text, text
    assert "infra.slurm.file_mounts_max_gb" in text, text
    assert not copy_dir(record, str(big)).parent.exists()
    with pytest.raises(MountError, match=r"is over 1\.0 KB, larger than the 16 bytes"):  # not walked past 64x
        stage(record, [("/opt/big", str(big))], 16)


def _deep(root: Path, levels: int) -> Path:
    """A tree ``levels`` directories deep (made by relative steps: its full path outgrows PATH_MAX)."""
    root.mkdir()
    here = os.getcwd()
    try:
        os.chdir(root)
        for _ in range(levels):
            os.mkdir("d")
            os.chdir("d")
        Path("leaf").write_text("x")
    finally:
        os.chdir(here)
    return root


def _undeep(root: Path, levels: int) -> None:
    """Remove what ``_deep`` made, bottom up (``shutil.rmtree`` recurses per level too)."""
    here = os.getcwd()
    try:
        os.chdir(root)
        for _ in range(levels):
            os.chdir("d")
        os.unlink("leaf")
        for _ in range(levels):
            os.chdir("..")
            os.rmdir("d")
    finally:
        os.chdir(here)


def test_a_tree_nested_deeper_than_corral_copies_is_refused_with_a_sentence_not_a_recursion_error(
        tmp_path: Path, private: Path) -> None:
    """A source 2,000 directories deep once made the submission's size check raise
    RecursionError (os.walk recursed per level): an HTTP 500 where a sentence was due."""
    deep = _deep(private / "deep", 2000)
    try:
        record = tmp_path / "mounts" / "4"
        record.mkdir(parents=True)
        said = oversized(tmp_path, [("/data", str(deep))], 1 << 30)
        assert list(said) == ["/data"] and "levels deep" in said["/data"], said
        with pytest.raises(MountError, match=r"^file_mounts\./data: .* nests directories over \d+ levels deep"):
            stage(record, [("/data", str(deep))], 1 << 30)
        assert not copy_dir(record, str(deep)).parent.exists()
    finally:
        _undeep(deep, 2000)
    shallow = _deep(private / "shallow", 40)  # as deep as real trees get: staged as before
    assert oversized(tmp_path, [("/data", str(shallow))], 1 << 30) == {}


def test_a_node_prefers_the_job_s_complete_copy_over_what_it_has_at_the_path(tmp_path: Path) -> None:
    """A node's own /data/x is not the submitter's: with a staged copy the link (and a
    container's bind) goes to the copy; without one, to the path as before."""
    source = tmp_path / "x"
    source.write_text("the node's own\n")
    record = tmp_path / "mounts" / "3"
    mounts = [(str(tmp_path / "remote"), str(source))]
    assert here(record, mounts) == [(mounts[0][0], str(source))]  # no copy: the source itself
    assert attach(record, mounts, str(tmp_path)) == [str(tmp_path / "remote")]
    assert os.readlink(tmp_path / "remote") == str(source)
    detach(record)
    copy = copy_dir(record, str(source))
    copy.parent.mkdir(parents=True)
    copy.write_text("the submitter's\n")
    assert here(record, mounts) == [(mounts[0][0], str(source))]  # not complete: not taken
    (copy.parent / COMPLETE).touch()
    assert here(record, mounts) == [(mounts[0][0], str(copy))]
    attach(record, mounts, str(tmp_path))
    assert (tmp_path / "remote").read_text() == "the submitter's\n"
    detach(record)
    assert not os.path.lexists(tmp_path / "remote") and source.read_text() == "the node's own\n"


def test_an_incomplete_copy_is_not_taken(tmp_path: Path) -> None:
    source = tmp_path / "x"
    source.write_text("seen\n")
    record = tmp_path / "mounts" / "4"
    copy = copy_dir(record, str(source))
    copy.parent.mkdir(parents=True)
    copy.write_text("cut short\n")
    assert here(record, [("/r", str(source))]) == [("/r", str(source))]


def test_the_program_stages_then_becomes_the_command_or_fails_the_attempt_saying_why(tmp_path: Path,
                                                                                   private: Path) -> None:
    src = private / "in.txt"
    src.write_text("submitter\n")
    record, run_dir, log = tmp_path / "mounts" / "5", tmp_path / "run", tmp_path / "replica.log"
    record.mkdir(parents=True)
    run_dir.mkdir()
    log.write_text("")
    argv = stage_command(record, (("/in", str(src)),), 1 << 20, str(run_dir), str(log), None)
    done = subprocess.run([*argv, "--", "sh", "-c", 'echo "ran as $$"; cat "$0"', str(copy_dir(record, str(src)))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ran as" in done.stdout and "submitter" in done.stdout, done.stdout
    assert f"corral: staged {src} for the Slurm nodes, which do not see it (10 bytes)" in log.read_text()
    assert not (run_dir / "exit_code").exists() and stage_failure(run_dir) == ""
    detach(record)

    record = tmp_path / "mounts" / "6"
    record.mkdir(parents=True)
    argv = stage_command(record, (("/in", str(src)),), 4, str(run_dir), str(log), None)
    done = subprocess.run([*argv, "--", "sh", "-c", "echo never"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "never" not in done.stdout
    said = stage_failure(run_dir)
    assert said.startswith("file_mounts./in: ") and "larger than the 4 bytes" in said, said
    assert (run_dir / "exit_code").read_text().strip() == "1" and (run_dir / "started").exists()
    assert f"corral: {said}" in log.read_text() and said in done.stderr


def test_a_root_stager_reads_with_the_job_s_account_s_rights_only(tmp_path: Path) -> None:
    """Staged as the job's account, never with the root server's rights: its own files arrive,
    a file of root's it may not read fails the step naming the mount (nothing of it copied),
    and what is staged is the account's."""
    from corral.node.staging import stage_as
    from unix_users import need_root, traversable_dir, unix_user

    need_root()
    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs /dev/shm")
    with traversable_dir() as root, unix_user("cistg") as ann:
        account = (ann.uid, ann.gid, tuple(ann.groups))
        src = Path("/dev/shm") / f"corral-stage-{ann.name}"
        src.mkdir(mode=0o755)
        try:
            (src / "public.txt").write_text("for everyone\n")
            (src / "public.txt").chmod(0o644)
            record = root / "mounts" / "8"
            record.mkdir(parents=True)
            os.chown(record, ann.uid, ann.gid)
            run_dir = root / "run"
            run_dir.mkdir()
            os.chown(run_dir, ann.uid, ann.gid)
            assert stage_as(account, record, [("/in", str(src))], 1 << 20, str(run_dir), ""), stage_failure(run_dir)
            copy = copy_dir(record, str(src))
            assert (copy / "public.txt").read_text() == "for everyone\n"
            assert copy.stat().st_uid == ann.uid and (copy / "public.txt").stat().st_uid == ann.uid

            (src / "secret.txt").write_text("root only\n")
            (src / "secret.txt").chmod(0o600)
            record2 = root / "mounts" / "9"
            record2.mkdir()
            os.chown(record2, ann.uid, ann.gid)
            assert not stage_as(account, record2, [("/in", str(src))], 1 << 20, str(run_dir), "")
            said = stage_failure(run_dir)
            assert said.startswith("file_mounts./in: ") and "Permission denied" in said, said
            assert (run_dir / "exit_code").stat().st_uid == ann.uid  # written as her
            assert not staged(record2, str(src))
            assert not (copy_dir(record2, str(src)) / "secret.txt").exists()
        finally:
            for name in ("public.txt", "secret.txt"):
                (src / name).unlink(missing_ok=True)
            src.rmdir()


def test_a_client_still_staging_is_found_by_the_step_it_will_start() -> None:
    """After a server restart an attempt whose handle was never stored is found by its srun's
    step name: so is one whose client still stages its sources before it becomes that srun."""
    import sys
    import time

    from corral.executors.slurm.cli import srun_clients

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "stage", "/r", "--", "srun",
                             "--jobid=1", "--job-name=corral-test-staging-k1"])
    try:
        found = {}
        for _ in range(100):
            found = srun_clients()
            if "corral-test-staging-k1" in found:
                break
            time.sleep(0.05)
        assert found.get("corral-test-staging-k1", (0,))[0] == proc.pid, found
    finally:
        proc.kill()
        proc.wait()
