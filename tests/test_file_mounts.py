"""file_mounts on a real server with the local executor: a file and a directory appear at
their remote paths (absolute and ``~/``) for every replica, relative sources resolve against
the submit directory, nothing corral did not make is replaced, and what it made is gone once
the job ends, cancelled too. Refusals name the mount. As another Unix account (root only): a
source the account cannot read is refused at submit, and the links are the account's."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from conftest import submit, wait_for, wait_state


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
    wait_for(lambda: os.path.islink(tmp_path / "m"))
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
    assert (tmp_path / "shared/m/shard-0").read_text() == "rows\n"  # the other job's still
    server.post(f"/v1/jobs/{second['id']}/cancel")
    wait_state(server, second["id"], "CANCELLED")
    wait_for(lambda: not os.path.lexists(tmp_path / "shared"), timeout=15)


def test_what_is_already_there_is_not_replaced(server, tmp_path: Path) -> None:
    work = _tree(tmp_path)
    (tmp_path / "taken").write_text("precious\n")
    job = submit(server, f"file_mounts: {{{tmp_path}/taken: cfg.yaml}}\nrun: echo ran\n", cwd=str(work))
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=30)
    events = server.get(f"/v1/jobs/{job['id']}/events").text
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
    ("/data: ./not-there", "file_mounts./data", "does not exist"),
])
def test_refusals_name_the_mount(server, tmp_path: Path, mount: str, field: str, words: str) -> None:
    work = _tree(tmp_path)
    response = server.post("/v1/jobs", json={"yaml": f"run: echo\nfile_mounts: {{{mount}}}\n", "cwd": str(work)})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    assert any(e["field"] == field and words in e["message"] for e in errors), errors


# -- as another Unix account (a root server, a throwaway user) --------------------------------------

def test_another_accounts_mounts_are_its_own_and_only_what_it_may_read(tmp_path: Path) -> None:
    """A root server never reads a source on a user's behalf: one only root may read is refused
    at submit naming the mount; a readable one is linked by the user (the link is theirs), and
    a remote path the user may not create fails the replica with a sentence naming it."""
    from unix_users import need_root, traversable_dir, unix_user

    need_root()
    from conformance.driver import Corral
    from conformance.harnesses import PARTITION, LocalHarness
    from conftest import kill_leftovers
    from corral.client import Client, InvalidRequest

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
        client = Client(corral.client().url, corral.client().create_token(ann.name)["token"])
        try:
            def run(yaml: str, name: str) -> int:
                return client.submit(yaml, name=name, base_dir=str(work),
                                     scheduling={"partition": PARTITION})["job"]["id"]

            with pytest.raises(InvalidRequest) as refused:
                run(f"file_mounts: {{{root}/s: secret.txt}}\nrun: cat {root}/s\n", "steal")
            assert any(e["field"] == f"file_mounts.{root}/s" and f"{ann.name} this job runs as cannot read "
                       f"{work}/secret.txt" in e["message"] for e in refused.value.errors), refused.value.errors

            job = run("file_mounts: {~/in/p.txt: public.txt}\nrun: cat ~/in/p.txt; stat -c 'link=%U' ~/in/p.txt; "
                      "stat -c 'dir=%U' ~/in\n", "mine")
            done = corral.wait_job(job, timeout=60)
            log = corral.log(job)
            assert done["state"] == "SUCCEEDED", str((done, log, corral.events(job)))
            assert "for everyone" in log and f"link={ann.name}" in log and f"dir={ann.name}" in log, log
            wait_for(lambda: not os.path.lexists(Path(ann.home) / "in"), timeout=15)

            job = run(f"file_mounts: {{{root}/not-hers/p.txt: public.txt}}\nrun: echo ran\n", "nowhere")
            done = corral.wait_job(job, timeout=60)
            said = str(corral.events(job))
            assert done["state"] == "FAILED" and "ran" not in corral.log(job), (done, said)
            assert f"file_mounts.{root}/not-hers/p.txt: the Unix account {ann.name} cannot create" in said, said
            assert not (root / "not-hers").exists()
        finally:
            client.close()
            try:
                corral.cancel_all()
            finally:
                corral.close_client()
                corral("server", "stop", check=False)
                kill_leftovers(home)


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
