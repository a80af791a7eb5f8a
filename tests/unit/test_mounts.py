"""file_mounts: the spec's refusals and normal form, and the node side (``corral.node.mounts``)
with real files: links made and removed exactly, nothing replaced, and the copy path for a
node that does not see the source, copied once for concurrent replicas."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from corral.node.mounts import MountError, attach, copy_dir, detach, pack
from corral.spec import SpecError, load_job
from corral.spec.models import TaskSpec


def _load(mounts: str, base: Path) -> TaskSpec:
    return load_job(f"run: echo\nfile_mounts:\n{mounts}", base_dir=str(base)).spec.tasks[0]


@pytest.mark.parametrize(("mounts", "field", "words"), [
    ("  /data: s3://bucket/x", "file_mounts./data", "corral cannot mount buckets"),
    ("  /data: gs://b", "file_mounts./data", "corral cannot mount buckets"),
    ("  /data: https://example.com/x.tgz", "file_mounts./data", "corral cannot mount buckets"),
    ("  /data: {source: r2://b, mode: MOUNT}", "file_mounts./data", "corral cannot mount buckets"),
    ("  /data: {name: mybucket, store: s3}", "file_mounts./data", "corral cannot mount buckets"),
    ("  data: /tmp", "file_mounts.data", "is relative"),
    ("  /a/../etc: /tmp", "file_mounts./a/../etc", "holds '..'"),
    ("  /etc/x: /tmp", "file_mounts./etc/x", "system path"),
    ("  /: /tmp", "file_mounts./", "system path"),
    ("  /usr: /tmp", "file_mounts./usr", "system path"),
    ("  /lib64/x: /tmp", "file_mounts./lib64/x", "system path"),
    ("  /var/run/x: /tmp", "file_mounts./var/run/x", "system path"),
    ("  /data: ./absent", "file_mounts./data", "does not exist (resolved against the submit directory"),
    ("  /data: /tmp\n  /data/sub: /tmp", "file_mounts", "/data/sub is inside /data, another of the task's mounts"),
    ("  ~/d: /tmp\n  ~/d/e/f: /tmp", "file_mounts", "~/d/e/f is inside ~/d"),
])
def test_refused_at_submit_naming_the_mount(tmp_path: Path, mounts: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        _load(mounts, tmp_path)
    assert any(i.field == field and words in i.message for i in info.value.issues), [str(i) for i in info.value.issues]


def test_sources_stored_absolute_and_validate_again(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "cfg.yaml").write_text("x: 1\n")
    task = _load("  /data/: ./data\n  ~/cfg.yaml: cfg.yaml\n  /var/tmp/x: data", tmp_path)
    assert task.file_mounts == {"/data": str(tmp_path / "data"), "~/cfg.yaml": str(tmp_path / "cfg.yaml"),
                                "/var/tmp/x": str(tmp_path / "data")}
    stored = task.model_dump(mode="json", exclude_defaults=True)
    assert TaskSpec.model_validate(stored) == task


def test_volumes_still_warned_not_silent(tmp_path: Path) -> None:
    loaded = load_job("run: echo\nvolumes: {/v: myvol}\n", base_dir=str(tmp_path))
    assert any("volumes" in w for w in loaded.warnings)


# -- the node side --------------------------------------------------------------------------------

def test_links_made_then_exactly_removed(tmp_path: Path) -> None:
    src_dir, src_file = tmp_path / "src", tmp_path / "f.txt"
    src_dir.mkdir()
    (src_dir / "a").write_text("A")
    src_file.write_text("F")
    home, record = tmp_path / "home", tmp_path / "record"
    home.mkdir()
    mounts = [(str(tmp_path / "remote/deep/d"), str(src_dir)), ("~/f.txt", str(src_file))]
    attach(record, mounts, str(home))
    assert (tmp_path / "remote/deep/d/a").read_text() == "A"
    assert (home / "f.txt").read_text() == "F" and (home / "f.txt").is_symlink()
    attach(record, mounts, str(home))  # another replica of the job, another attempt: kept
    (tmp_path / "remote/mine").write_text("the user's")  # put beside by the job: not corral's
    detach(record)
    assert not (home / "f.txt").exists() and not (tmp_path / "remote/deep").exists()
    assert (tmp_path / "remote/mine").read_text() == "the user's"
    assert src_dir.joinpath("a").read_text() == "A" and src_file.read_text() == "F"  # sources untouched
    assert not record.exists()


def test_something_already_there_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "taken").write_text("precious")
    os.symlink(str(tmp_path / "src"), tmp_path / "same-link")  # even a link to the same source: not corral's
    for remote in ("taken", "same-link"):
        with pytest.raises(MountError, match=f"file_mounts.{tmp_path}/{remote}: .* already exists .* corral did "
                                             "not make it"):
            attach(tmp_path / "record", [(str(tmp_path / remote), str(tmp_path / "src"))], str(tmp_path))
    detach(tmp_path / "record")
    assert (tmp_path / "taken").read_text() == "precious" and (tmp_path / "same-link").is_symlink()


def test_jobs_of_one_account_linking_one_path_to_one_source_share_the_link(tmp_path: Path) -> None:
    """A YAML launched twice, an array's elements: the link is there while any of them runs,
    and goes (with the directories made above it) when the last one ends, whichever it is."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_text("A")
    mounts = [(str(tmp_path / "made/above/m"), str(tmp_path / "src"))]
    first, second, third = (tmp_path / f"record{n}" for n in (1, 2, 3))
    attach(first, mounts, str(tmp_path))
    attach(second, mounts, str(tmp_path))
    attach(second, mounts, str(tmp_path))  # its next replica, its next attempt: still one use
    attach(third, mounts, str(tmp_path))
    detach(first)  # the one that made it ends first
    assert (tmp_path / "made/above/m/a").read_text() == "A"
    detach(third)
    assert (tmp_path / "made/above/m/a").read_text() == "A"
    detach(second)
    assert not (tmp_path / "made").exists()
    assert (tmp_path / "src" / "a").read_text() == "A"


def test_a_link_to_another_source_or_of_a_job_gone_is_not_shared(tmp_path: Path) -> None:
    for name in ("src", "other"):
        (tmp_path / name).mkdir()
    remote = str(tmp_path / "m")
    attach(tmp_path / "record1", [(remote, str(tmp_path / "src"))], str(tmp_path))
    with pytest.raises(MountError, match=f"file_mounts.{remote}: .* already exists .* to the same source"):
        attach(tmp_path / "record2", [(remote, str(tmp_path / "other"))], str(tmp_path))
    shutil.rmtree(tmp_path / "record1")  # its job's record gone (not ended by corral): nobody's now
    with pytest.raises(MountError, match="already exists"):
        attach(tmp_path / "record3", [(remote, str(tmp_path / "src"))], str(tmp_path))
    assert os.readlink(remote) == str(tmp_path / "src")  # and never replaced


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the link to another account")
def test_another_account_s_link_is_not_shared(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    remote = str(tmp_path / "m")
    attach(tmp_path / "record1", [(remote, str(tmp_path / "src"))], str(tmp_path))
    os.lchown(remote, 4242, 4242)  # (as if another account had made it, with its own state)
    with pytest.raises(MountError, match="already exists"):
        attach(tmp_path / "record2", [(remote, str(tmp_path / "src"))], str(tmp_path))


def test_a_link_changed_since_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    attach(tmp_path / "record", [(str(tmp_path / "m"), str(tmp_path / "src"))], str(tmp_path))
    os.unlink(tmp_path / "m")
    (tmp_path / "m").write_text("the job's own file now")
    detach(tmp_path / "record")
    assert (tmp_path / "m").read_text() == "the job's own file now"


def test_a_path_that_cannot_be_created_says_which_mount(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:
        pytest.skip("root creates anywhere")
    with pytest.raises(MountError, match=r"file_mounts\.~/x/y: the Unix account .* cannot create"):
        attach(tmp_path / "record", [("~/x/y", str(tmp_path / "src"))], str(locked))


def test_copy_path_when_the_node_does_not_see_the_source(tmp_path: Path) -> None:
    """A node without the source: one copy per job per node, however many replicas start at
    once, linked at the remote path; gone with the job."""
    src = tmp_path / "dataset"
    (src / "sub").mkdir(parents=True)
    (src / "sub/x.bin").write_bytes(b"\x00\x01" * 1000)
    (src / "README").write_text("data")
    record = tmp_path / "node-record"
    fetched = []

    def archive(source: str) -> bytes:
        fetched.append(source)
        return pack(source)

    errors = []

    def replica(i: int) -> None:
        try:
            attach(record, [("~/data", str(src))], str(tmp_path / f"home{i % 2}"), sees=lambda _: False,
                   archive=archive)
        except Exception as exc:  # pragma: no cover - the assertion below shows it
            errors.append(exc)

    for i in range(2):
        (tmp_path / f"home{i}").mkdir()
    threads = [threading.Thread(target=replica, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and fetched == [str(src)]  # copied once
    copy = copy_dir(record, str(src))
    for i in range(2):
        link = tmp_path / f"home{i}/data"
        assert os.readlink(link) == str(copy)
        assert (link / "sub/x.bin").read_bytes() == b"\x00\x01" * 1000 and (link / "README").read_text() == "data"
    detach(record)
    assert not (tmp_path / "home0/data").exists() and not copy.exists() and src.joinpath("README").exists()


def test_copy_refused_without_a_way_to_bring_it(tmp_path: Path) -> None:
    with pytest.raises(MountError, match=r"file_mounts\./d: /nowhere is not visible on this node"):
        attach(tmp_path / "r", [("/d", "/nowhere")], str(tmp_path), sees=lambda _: False)


def test_an_archive_reaching_outside_its_source_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evil").mkdir()
    evil = pack(str(tmp_path / "evil"))
    with pytest.raises(MountError, match="not named|not part of it"):
        attach(tmp_path / "r", [(str(tmp_path / "m"), "/else/where")], str(tmp_path), sees=lambda _: False,
               archive=lambda _: evil)


# -- binds (``corral.node.binds``): a root server's mount points and targets --------------------

def test_without_a_namespace_a_conflicting_link_says_why(tmp_path: Path) -> None:
    """Two jobs with different sources at one path: with links, the second is refused, and
    the sentence says why there is no bind (not root, or namespaces refused)."""
    from corral.node.mounts import attach_as

    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    attach_as(None, tmp_path / "rec" / "1", ((str(tmp_path / "m"), str(tmp_path / "a")),), str(tmp_path))
    assert os.readlink(tmp_path / "m") == str(tmp_path / "a")  # (no runner binds for this record)
    with pytest.raises(MountError) as refused:
        attach_as(None, tmp_path / "rec" / "2", ((str(tmp_path / "m"), str(tmp_path / "b")),), str(tmp_path))
    why = "this node refuses mount namespaces" if os.geteuid() == 0 else "the server does not run as root"
    assert why in str(refused.value) and "one source per path" in str(refused.value), refused.value
    for n in (1, 2):
        detach(tmp_path / "rec" / str(n))
    assert not os.path.lexists(tmp_path / "m")


@pytest.mark.skipif(os.geteuid() != 0, reason="mount points are kept in root's state directory")
def test_a_mount_point_made_goes_when_its_last_job_ends(tmp_path: Path) -> None:
    from corral.node.binds import prepare, release

    (tmp_path / "src").mkdir()
    records = [tmp_path / "rec" / str(n) for n in range(2)]
    for record in records:
        record.mkdir(parents=True)
        found = prepare(record, ((f"{tmp_path}/made/here", str(tmp_path / "src")),), "", None, ())
        assert found[0].directory and found[0].target == f"{tmp_path}/made/here"
    release(records[0])
    assert (tmp_path / "made/here").is_dir()  # the other job's still
    release(records[1])
    assert not (tmp_path / "made").exists()  # with the directory made above it
    (tmp_path / "there").mkdir()
    (tmp_path / "there/kept").write_text("mine")
    prepare(records[0], ((f"{tmp_path}/there", str(tmp_path / "src")),), "", None, ())
    release(records[0])
    assert (tmp_path / "there/kept").read_text() == "mine"  # not made by corral: never removed


@pytest.mark.skipif(os.geteuid() != 0, reason="links of another account need root to make")
def test_a_target_is_never_reached_through_another_account_s_link(tmp_path: Path) -> None:
    """The root that binds walks the target itself: a link another account made is not
    followed, and one root made is followed only to a path a job may use."""
    from corral.node.binds import Bind, BindError, _open_target

    (tmp_path / "theirs").symlink_to("/tmp")
    os.lchown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(BindError, match="a link another account made"):
        _open_target(Bind("/r", f"{tmp_path}/theirs/x", "/tmp", (0, 0), True), ())
    (tmp_path / "roots").symlink_to("/etc")
    with pytest.raises(BindError, match="leads to /etc/hostname: /etc/hostname is a system path"):
        _open_target(Bind("/r", f"{tmp_path}/roots/hostname", "/tmp", (0, 0), False), ())
    (tmp_path / "home").mkdir()
    with pytest.raises(BindError, match="would shadow corral's own directory"):
        _open_target(Bind("/r", f"{tmp_path}/home", "/tmp", (0, 0), True), (f"{tmp_path}/home/corral",))
    os.close(_open_target(Bind("/r", f"{tmp_path}/home", "/tmp", (0, 0), True), ()))


def test_a_directory_made_above_two_mount_points_goes_whichever_is_freed_first(tmp_path, monkeypatch) -> None:
    """``/mnt`` made for ``/mnt/data`` (its record) also holds ``/mnt/cfg.txt``: freed in
    either order, nothing corral made is left."""
    import os

    from corral.node import binds

    for order in (0, 1):
        root = tmp_path / f"o{order}"
        monkeypatch.setattr(binds, "STATE_DIR", root / "state")
        mnt, record = root / "mnt", root / "record"
        record.mkdir(parents=True)
        mnt.mkdir()
        (mnt / "data").mkdir()
        (mnt / "cfg.txt").write_bytes(b"")

        def made(*paths):
            return [[str(p), os.lstat(p).st_dev, os.lstat(p).st_ino] for p in paths]

        records = [made(mnt / "data", mnt), made(mnt / "cfg.txt")]
        (root / "state").mkdir()
        for name, entry in zip(("1.json", "2.json"), records if order == 0 else records[::-1]):
            with binds._State(root / "state" / name) as state:  # released in the files' order
                state["users"].append(str(record))
                state["made"] = entry
        binds.release(record)
        assert not mnt.exists() and list((root / "state").iterdir()) == []


def test_mount_points_are_checked_where_the_account_cannot_forge_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mount points and the source's identity are found as the job's account by a process
    the account can neither trace nor write into (a program it ran could be: ptrace, then a
    write of its own JSON; root then bound a source the account cannot reach, and removed
    root's empty directories named as "made"); and what it says was made is only the target
    and directories above it."""
    import ctypes
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from unix_users import need_root, traversable_dir, unix_user

    import corral.node.mountpoints as mountpoints

    need_root()
    with traversable_dir() as root, unix_user("cidf") as ann:
        (root / "src").mkdir()
        target = str(root / "pt")
        os.chmod(root, 0o1777)
        real = mountpoints.mount_points

        def dumpable(wanted: list, me: str = "") -> list:  # (what the process that checks them may be)
            found = real(wanted, me)
            found[0]["dumpable"] = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            return found

        monkeypatch.setattr(mountpoints, "mount_points", dumpable)
        found = mountpoints.mount_points_as(ann, [("/pt", target, str(root / "src"))])
        assert found[0].get("dumpable") == 0
        assert [m[0] for m in found[0]["made"]] == [target]
        os.rmdir(target)

        def forged(wanted: list, me: str = "") -> list:
            found = real(wanted, me)
            found[0]["made"].append(["/var/lib", 1, 2])
            return found

        monkeypatch.setattr(mountpoints, "mount_points", forged)
        with pytest.raises(MountError, match="file_mounts./pt: what was made for it is not at"):
            mountpoints.mount_points_as(ann, [("/pt", target, str(root / "src"))])


def test_the_check_works_in_a_process_holding_over_1024_descriptors() -> None:
    """A server holds many descriptors (connections, logs, pipes): the check's pipe may be
    numbered past 1024, which ``select`` refuses (the whole suite's process met it)."""
    import resource
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from unix_users import need_root, traversable_dir, unix_user

    import corral.node.mountpoints as mountpoints

    need_root()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this machine allows {hard} descriptors a process")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        with traversable_dir() as root, unix_user("cifd") as ann:
            (root / "src").mkdir()
            os.chmod(root, 0o1777)
            found = mountpoints.mount_points_as(ann, [("/pt", str(root / "pt"), str(root / "src"))])
            assert [m[0] for m in found[0]["made"]] == [str(root / "pt")]
            os.rmdir(root / "pt")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_directory_made_above_several_mount_points_goes_when_the_last_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int) -> None:
    """Mount points at /d/m/0 and /d/m/1 (one job's, or two jobs'), where /d/m did not exist:
    /d/m is made once, for the first, and was left behind (not empty when the first went,
    and the second never made it)."""
    from corral.node import binds

    monkeypatch.setattr(binds, "STATE_DIR", tmp_path / "state")
    (tmp_path / "src").mkdir()
    (tmp_path / "d").mkdir()
    records = [tmp_path / f"job{i}" for i in range(jobs)]
    for record in records:
        record.mkdir()
    wanted = [(f"{tmp_path}/d/m/{i}", str(tmp_path / "src")) for i in range(2)]
    if jobs == 1:
        binds.prepare(records[0], tuple(wanted), "/root", None, ())
    else:
        for record, mount in zip(records, wanted):
            binds.prepare(record, (mount,), "/root", None, ())
    assert sorted(os.listdir(tmp_path / "d" / "m")) == ["0", "1"]
    for record in records:
        binds.release(record)
        shutil.rmtree(record)
    assert os.listdir(tmp_path / "d") == []
    assert os.listdir(tmp_path / "state") == []


def test_what_was_made_is_removed_through_no_link_of_an_account(tmp_path: Path) -> None:
    """A mount point made below a link of the account's own (``/data/lnk/x``) is not removed
    through it: the account may point the link elsewhere meanwhile, where an entry of that name
    may have the very inode number (reused) and be someone else's. Root's links are followed."""
    from corral.node.binds import _remove

    if os.geteuid() != 0:
        pytest.skip("a link of another account is made with lchown, which needs root")
    (tmp_path / "real" / "x").mkdir(parents=True)
    info = os.stat(tmp_path / "real" / "x")
    (tmp_path / "lnk").symlink_to(tmp_path / "real")
    os.lchown(tmp_path / "lnk", 65534, 65534)
    assert _remove([[f"{tmp_path}/lnk/x", info.st_dev, info.st_ino]]) == []
    assert (tmp_path / "real" / "x").is_dir()
    os.lchown(tmp_path / "lnk", 0, 0)
    _remove([[f"{tmp_path}/lnk/x", info.st_dev, info.st_ino]])
    assert not (tmp_path / "real" / "x").exists()


def test_no_mount_shadows_the_code_the_server_runs(tmp_path: Path) -> None:
    """The server's namespace thread runs Python as root after a replica's mounts are bound:
    its interpreter's prefix, its site-packages and the corral package's directory are its own,
    as its home is (a job could bind files of its own where an import would read them)."""
    import sys

    import corral
    from corral.node.runner import NodeRunner
    from corral.spec.mounts import corral_dirs, shadows

    package = os.path.dirname(os.path.dirname(os.path.realpath(corral.__file__)))
    runner = NodeRunner(tmp_path / "runs", tmp_path / "run", "test")
    for own in (corral_dirs(), runner.own_dirs()):
        for path in (os.path.realpath(sys.prefix), package, os.path.join(package, "corral")):
            assert "would shadow corral's own directory" in (shadows(path, own) or ""), (path, own)
        assert shadows("/data/x", own) is None


def test_the_account_can_neither_stop_the_check_nor_read_past_its_rights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs with the account's rights on files (a 0600 file of root's is refused),
    yet the account may not signal it: stopped, it held the server's start (its control loop,
    on the local executor) until the check's deadline (hostile trial)."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from unix_users import need_root, traversable_dir, unix_user

    import corral.node.mountpoints as mountpoints

    need_root()
    with traversable_dir() as root, unix_user("cistop") as ann:
        (root / "src").mkdir()
        (root / "private").write_text("root's\n")
        os.chmod(root / "private", 0o600)
        os.chmod(root, 0o1777)
        with pytest.raises(MountError, match=r"file_mounts\./p: the Unix account .* cannot read .*private"):
            mountpoints.mount_points_as(ann, [("/p", str(root / "p"), str(root / "private"))])
        real, pid_file = mountpoints.mount_points, root / "pid"

        def slow(wanted: list, me: str = "") -> list:  # (in the checking child)
            os.write(os.open(pid_file, os.O_WRONLY | os.O_CREAT, 0o644), str(os.getpid()).encode())
            time.sleep(1.5)
            return real(wanted, me)

        monkeypatch.setattr(mountpoints, "mount_points", slow)
        found: list = []
        check = threading.Thread(target=lambda: found.append(
            mountpoints.mount_points_as(ann, [("/pt", str(root / "pt"), str(root / "src"))])))
        check.start()
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        child = int(pid_file.read_text())
        tried = subprocess.run(["kill", f"-{signal.SIGSTOP.value}", str(child)], user=ann.uid, group=ann.gid,
                               capture_output=True, text=True, cwd="/")
        check.join(20)
        assert tried.returncode != 0, "the account stopped the check"
        assert found and [m[0] for m in found[0][0]["made"]] == [str(root / "pt")]
        os.rmdir(root / "pt")
