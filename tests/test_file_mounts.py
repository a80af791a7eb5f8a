"""file_mounts on a real server with the local executor: a file and a directory appear at
their remote paths (absolute and ``~/``) for every replica, relative sources resolve against
the submit directory, nothing on the machine is replaced, and what corral made is gone once
the job ends, cancelled too. Where the server is root (binds in each replica's own mount
namespace), two jobs with different sources at one path run side by side, each reading its
own, and a replica with binds runs with no_new_privs. Refusals name the mount and its line.
As another Unix account (root only): a source the account cannot read is refused at submit,
what corral makes on the machine is the account's, and a setuid program gains it nothing."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import submit, wait_for, wait_state
from corral.node.runner import _mount_namespaces

# the server (this process) binds mounts in each replica's namespace, rather than linking them
BINDS = os.geteuid() == 0 and _mount_namespaces()
needs_binds = pytest.mark.skipif(not BINDS, reason="binds need a root server that may make mount namespaces")


def _tree(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    (work / "data").mkdir(parents=True)
    (work / "data/shard-0").write_text("rows\n")
    (work / "cfg.yaml").write_text("lr: 0.1\n")
    return work


def test_a_file_and_a_directory_appear_for_every_replica_and_go_with_the_job(server, tmp_path: Path) -> None:
    work = _tree(tmp_path)
    remote = tmp_path / "remote"
    home_name = f"corral-mt-{uuid.uuid4().hex[:8]}"
    home_link = Path(os.path.expanduser("~")) / home_name
    job = submit(server, f"""
name: mounts
num_nodes: 2
file_mounts:
  {remote}/data: data
  ~/{home_name}/cfg.yaml: ./cfg.yaml
run: cat {remote}/data/shard-0 ~/{home_name}/cfg.yaml; ls {remote}/data
""", cwd=str(work))
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    log = server.get(f"/v1/jobs/{job['id']}/logs").text
    assert done["state"] == "SUCCEEDED", log
    assert log.count("rows") == 2 and log.count("lr: 0.1") == 2 and log.count("shard-0") == 2, log
    wait_for(lambda: not os.path.lexists(remote / "data") and not os.path.lexists(home_link), timeout=15)
    assert not remote.exists() and not home_link.exists()  # the directories corral made for them too
    assert (work / "data/shard-0").read_text() == "rows\n"  # the sources are untouched


def test_cancelled_job_leaves_no_mount(server, tmp_path: Path) -> None:
    work = _tree(tmp_path)
    job = submit(server, f"file_mounts: {{{tmp_path}/m: data}}\nrun: exec sleep 300\n", cwd=str(work))
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: os.path.lexists(tmp_path / "m"))  # a link, or the mount point of the replica's bind
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")
    wait_for(lambda: not os.path.lexists(tmp_path / "m"), timeout=15)


def test_two_jobs_mounting_one_source_at_one_path_run_together(server, tmp_path: Path) -> None:
    """The same file launched twice (or an array): both run with the mount; it stays while
    either runs and goes when the last ends, whichever ends first."""
    work = _tree(tmp_path)
    spec = f"file_mounts: {{{tmp_path}/shared/m: data}}\nrun: cat {tmp_path}/shared/m/shard-0; exec sleep 300\n"
    first, second = (submit(server, f"name: twice{n}\n" + spec, cwd=str(work)) for n in range(2))
    for job in (first, second):
        wait_state(server, job["id"], "RUNNING")
        wait_for(lambda j=job: "rows" in server.get(f"/v1/jobs/{j['id']}/logs").text, timeout=15)
    server.post(f"/v1/jobs/{first['id']}/cancel")
    wait_state(server, first["id"], "CANCELLED")
    assert os.path.lexists(tmp_path / "shared/m")  # the other job's still
    if not BINDS:  # (a bind is the replica's alone: the machine sees the empty mount point)
        assert (tmp_path / "shared/m/shard-0").read_text() == "rows\n"
    server.post(f"/v1/jobs/{second['id']}/cancel")
    wait_state(server, second["id"], "CANCELLED")
    wait_for(lambda: not os.path.lexists(tmp_path / "shared"), timeout=15)


@needs_binds
def test_two_jobs_with_different_sources_at_one_path_each_read_their_own(server, tmp_path: Path) -> None:
    """An array's elements, or two users, with ``/data: ./mydata``: each replica's own source
    at the one path, side by side; nothing left on the machine once both end. Each replica
    with binds runs with no_new_privs."""
    target = tmp_path / "one" / "data"
    jobs = []
    for n in range(2):
        work = tmp_path / f"user{n}"
        (work / "mydata").mkdir(parents=True)
        (work / "mydata/who").write_text(f"source-{n}\n")
        jobs.append(submit(server, f"name: side{n}\nfile_mounts: {{{target}: ./mydata}}\n"
                                   f"run: cat {target}/who; awk '$5 == \"/\" {{print \"root mount:\", $6}}' /proc/self/mountinfo; "
                                   "grep NoNewPrivs /proc/self/status; exec sleep 300\n",
                           cwd=str(work)))
    for n, job in enumerate(jobs):
        wait_state(server, job["id"], "RUNNING")
        log = wait_for(lambda j=job: (lambda t: "NoNewPrivs" in t and t)(server.get(f"/v1/jobs/{j['id']}/logs").text),
                       timeout=15)
        assert f"source-{n}" in log and f"source-{1 - n}" not in log, log
        assert "NoNewPrivs:\t1" in log, log
        assert "nosuid" in log.split("root mount:")[1].splitlines()[0], log  # for what joins it later too
    assert os.listdir(target) == []  # the machine's own view: an empty mount point, no link, no copy
    # what joins a replica later (corral exec, shell, exec probes) runs with no_new_privs too
    with server.websocket_connect(f"/v1/jobs/{jobs[0]['id']}/shell") as ws:
        ws.send_text(json.dumps({"command": ["sh", "-c", f"cat {target}/who; grep NoNewPrivs /proc/self/status"]}))
        out = b""
        while True:
            message = ws.receive()
            if message.get("bytes") is not None:
                out += message["bytes"][1:]
            elif "exit" in json.loads(message["text"]):
                break
    assert out.decode().split() == ["source-0", "NoNewPrivs:", "1"], out
    for job in jobs:
        server.post(f"/v1/jobs/{job['id']}/cancel")
        wait_state(server, job["id"], "CANCELLED")
    wait_for(lambda: not os.path.lexists(tmp_path / "one"), timeout=15)  # the directories made for it too
    assert (tmp_path / "user0/mydata/who").read_text() == "source-0\n"


def test_what_is_already_there_is_not_replaced(server, tmp_path: Path) -> None:
    """A link never replaces what is there; a bind shows the source over it to the replica
    alone, and the machine's file stays as it was."""
    work = _tree(tmp_path)
    (tmp_path / "taken").write_text("precious\n")
    job = submit(server, f"file_mounts: {{{tmp_path}/taken: cfg.yaml}}\nrun: cat {tmp_path}/taken\n", cwd=str(work))
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=30)
    events = server.get(f"/v1/jobs/{job['id']}/events").text
    if BINDS:
        assert done["state"] == "SUCCEEDED", events
        assert "lr: 0.1" in server.get(f"/v1/jobs/{job['id']}/logs").text
        assert (tmp_path / "taken").read_text() == "precious\n"
        return
    assert done["state"] == "FAILED", events
    assert f"file_mounts.{tmp_path}/taken: {tmp_path}/taken already exists" in events, events
    assert (tmp_path / "taken").read_text() == "precious\n"
    wait_for(lambda: not (server.state.settings.home / "mounts" / str(job["id"])).exists(), timeout=15)
    assert (tmp_path / "taken").read_text() == "precious\n"


@pytest.mark.parametrize(("mount", "field", "words"), [
    ("/data: s3://my-bucket/train", "file_mounts./data", "corral cannot mount buckets"),
    ("/data: {source: gs://b, mode: MOUNT}", "file_mounts./data", "corral cannot mount buckets"),
    ("data: cfg.yaml", "file_mounts.data", "is relative"),
    ("/etc/app.yaml: cfg.yaml", "file_mounts./etc/app.yaml", "system path a job may not shadow"),
    ("/proc/self: data", "file_mounts./proc/self", "system path a job may not shadow"),
    ("/data: ./not-there", "file_mounts./data", "does not exist"),
    ("/data: /proc/self/root/etc", "file_mounts./data", "is under /proc, the kernel's own view"),
    ("HOME/runs: data", "file_mounts.HOME/runs", "would shadow corral's own directory"),
    ("HOME_PARENT: data", "file_mounts.HOME_PARENT", "would shadow corral's own directory"),
])
def test_refusals_name_the_mount(server, tmp_path: Path, mount: str, field: str, words: str) -> None:
    work = _tree(tmp_path)
    home = os.path.realpath(server.state.settings.home)  # corral's run directories: the replica's wrapper writes there
    mount, field = (x.replace("HOME_PARENT", os.path.dirname(home)).replace("HOME", home) for x in (mount, field))
    response = server.post("/v1/jobs", json={"yaml": f"run: echo\nfile_mounts:\n  {mount}\n", "cwd": str(work)})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    assert any(e["field"] == field and words in e["message"] and e["line"] == 3 for e in errors), errors


# -- as another Unix account (a root server, a throwaway user) --------------------------------------

def test_another_accounts_mounts_are_its_own_and_only_what_it_may_read(tmp_path: Path) -> None:
    """A root server never reads a source on a user's behalf: one only root may read is refused
    at submit naming the mount; a readable one appears for the user (what is made on the
    machine is theirs), a remote path the user may not create fails the replica with a
    sentence naming it, and a setuid-root program run beside a bind gains the replica nothing
    (no_new_privs)."""
    from unix_users import need_root, traversable_dir, unix_user

    need_root()
    from conformance.driver import Corral
    from conformance.harnesses import PARTITION, LocalHarness
    from conftest import kill_leftovers
    from corral.client import InvalidRequest

    with traversable_dir() as root, unix_user("cidm") as ann:
        home = root / "home"
        home.mkdir()
        (home / "config.yaml").write_text(LocalHarness().site())
        corral = Corral(home, LocalHarness())
        corral.start()
        work = root / "submitted"
        work.mkdir(mode=0o755)
        (work / "public.txt").write_text("for everyone\n")
        (work / "public.txt").chmod(0o644)
        (work / "secret.txt").write_text("root only\n")
        (work / "secret.txt").chmod(0o600)
        suid = root / "suid-id"  # a setuid-root ``id``: euid 0 for whoever runs it, unless no_new_privs
        shutil.copy("/usr/bin/id", suid)
        suid.chmod(0o4755)
        with corral.as_account(ann.name, lambda: kill_leftovers(home)) as client:
            def run(yaml: str, name: str) -> int:
                return client.submit(yaml, name=name, base_dir=str(work),
                                     scheduling={"partition": PARTITION})["job"]["id"]

            with pytest.raises(InvalidRequest) as refused:
                run(f"file_mounts: {{{root}/s: secret.txt}}\nrun: cat {root}/s\n", "steal")
            assert any(e["field"] == f"file_mounts.{root}/s" and f"{ann.name} this job runs as cannot read "
                       f"{work}/secret.txt" in e["message"] for e in refused.value.errors), refused.value.errors

            job = run("file_mounts: {~/in/p.txt: public.txt}\nrun: cat ~/in/p.txt; stat -c 'link=%U' ~/in/p.txt; "
                      f"stat -c 'dir=%U' ~/in; echo euid=$({suid} -u)\n", "mine")
            done = corral.wait_job(job, timeout=60)
            log = corral.log(job)
            assert done["state"] == "SUCCEEDED", str((done, log, corral.events(job)))
            assert "for everyone" in log and f"dir={ann.name}" in log, log
            if BINDS:  # the bound file itself (its owner root); the replica can gain no rights
                assert f"euid={ann.uid}" in log, log
            else:  # the link the account made
                assert f"link={ann.name}" in log, log
            wait_for(lambda: not os.path.lexists(Path(ann.home) / "in"), timeout=15)

            job = run(f"file_mounts: {{{root}/not-hers/p.txt: public.txt}}\nrun: echo ran\n", "nowhere")
            done = corral.wait_job(job, timeout=60)
            said = str(corral.events(job))
            assert done["state"] == "FAILED" and "ran" not in corral.log(job), (done, said)
            assert f"file_mounts.{root}/not-hers/p.txt: the Unix account {ann.name} cannot create" in said, said
            assert not (root / "not-hers").exists()


def test_a_source_sent_to_another_node_is_read_with_the_account_s_rights() -> None:
    """What a node that does not see a source is sent (a Ray worker elsewhere) is packed
    with the job's account's rights, never the root server's: its secret stays unread, its
    own file arrives whole, and one over the limit is not packed at all."""
    import io
    import tarfile

    from corral.node.mounts import pack_as
    from unix_users import need_root, traversable_dir, unix_user

    need_root()
    with traversable_dir() as root, unix_user("cidp") as ann:
        reader = (ann.uid, ann.gid, tuple(ann.groups))
        (root / "public.txt").write_text("for everyone\n")
        (root / "public.txt").chmod(0o644)
        (root / "secret.txt").write_text("root only\n")
        (root / "secret.txt").chmod(0o600)
        with pytest.raises(OSError, match="Permission denied"):
            pack_as(reader, str(root / "secret.txt"), 1 << 20)
        packed = pack_as(reader, str(root / "public.txt"), 1 << 20)
        with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
            assert tar.extractfile("public.txt").read() == b"for everyone\n"
        assert pack_as(reader, str(root / "public.txt"), 4) is None  # 13 bytes, over a 4-byte limit
        assert pack_as(None, str(root / "secret.txt"), 1 << 20)  # the server's own rights read it
