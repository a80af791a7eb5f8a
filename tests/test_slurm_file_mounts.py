"""file_mounts on the slurm-lab's nodes when they do not see a source: the root server runs in a
mount namespace of its own with a private tmpfs at a path where the nodes (slurmd, in this
machine's own namespace) have files of their own. Each source there is staged (copied once per
job into the job's record, in corral's home, as the job's account) and a replica on a Slurm
node reads the submitter's content, not its node's (in a container too); another account's job is refused a file of
root's it may not read (never copied with root's rights); a source over
``infra.slurm.file_mounts_max_gb`` fails the job with a sentence naming the mount, its size and
the limit; nothing is left when the jobs end. Needs root (unshare, mount, throwaway accounts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from slurm_env import slurm_env

ENV = slurm_env(keep_job_variables=False)
LIMIT = "infra: {slurm: {file_mounts_max_gb: 0.001}}\n"  # 1 MB


def _why_not() -> str | None:
    from conformance.harnesses import SlurmHarness

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "a server in a mount namespace of its own, with a private tmpfs, needs root and unshare"
    return SlurmHarness().why_unavailable()


# (its id names the slurm-lab, so the suite's scheduler runs it with the lab's other tests:
# tests/conftest.py's groups)
@pytest.mark.parametrize("lab", ["slurm"])
def test_sources_the_slurm_nodes_do_not_see_are_staged_as_the_account_and_go_with_the_job(lab: str) -> None:
    why = _why_not()
    if why:
        pytest.skip(why)
    from conformance.driver import Corral
    from conformance.harnesses import PARTITION, SlurmHarness
    from unix_users import slurm_association, traversable_dir, unix_user

    with traversable_dir() as root, unix_user("cstg") as ann, slurm_association(ann.name, {**ENV}):
        private = root / "private"  # the submitter's alone (a tmpfs in the server's namespace) ...
        for name, text in (("data/a.txt", "node's own shard\n"), ("cfg.txt", "node's own cfg\n")):
            (private / name).parent.mkdir(parents=True, exist_ok=True)
            (private / name).write_text(text)  # ... where the nodes have files of their own
        private.chmod(0o755)
        made = root / "made"  # what the submitter's tmpfs holds, made here then copied there
        (made / "data").mkdir(parents=True)
        (made / "data/a.txt").write_text("submitter's shard\n")
        (made / "cfg.txt").write_text("submitter's cfg\n")
        (made / "big").mkdir()
        (made / "big/weights.bin").write_bytes(os.urandom(2 * 2**20))  # 2 MB, over the 1 MB limit
        (made / "hers").mkdir()
        (made / "hers/mine.txt").write_text("hers alone\n")
        (made / "hers/mine.txt").chmod(0o600)
        os.chown(made / "hers", ann.uid, ann.gid)
        os.chown(made / "hers/mine.txt", ann.uid, ann.gid)
        (made / "shared").mkdir()
        (made / "shared/public.txt").write_text("for everyone\n")
        (made / "shared/public.txt").chmod(0o644)
        (made / "shared/secret.txt").write_text("root only\n")
        (made / "shared/secret.txt").chmod(0o600)
        for path in [made, *made.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)

        home = root / "home"
        home.mkdir()
        harness = SlurmHarness()
        from container_lab import SITE as CONTAINERS

        (home / "config.yaml").write_text(harness.site() + LIMIT + CONTAINERS)
        corral = Corral(home, harness)
        # the server (and the srun clients it starts) in a mount namespace of its own, where a
        # tmpfs over ``private`` holds the submitter's files; the nodes see the ones beneath
        start = ('mount -t tmpfs -o size=16m,mode=0755 corral-stage-test "$1" && cp -a "$2"/. "$1"/ && shift 2 && '
                 'exec "$@"')
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", start, "sh",
                               str(private), str(made), sys.executable, "-m", "corral.cli.main", "server", "start"],
                              env=corral.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        shutil.rmtree(made)
        assert (private / "data/a.txt").read_text() == "node's own shard\n"  # not the server's view
        records = home / "mounts"  # each job's record of its mounts, with its staged copies (NodeRunner.mounts_dir)
        admin = corral.client()
        with corral.as_account(ann.name, lambda: harness.cleanup(home)) as client:
            def record_of(job: int) -> Path | None:
                return next(iter(home.rglob(f"mounts/{job}")), None)

            # a job of the server's own account, two replicas starting together on two nodes
            remote = root / "mnt"
            job = admin.submit(f"""
name: staged
num_nodes: 2
resources: {{accelerators: H100:8}}
file_mounts: {{{remote}/data: {private}/data, {remote}/cfg.txt: {private}/cfg.txt}}
run: |
  echo "read $(cat {remote}/data/a.txt) / $(cat {remote}/cfg.txt) on $(hostname)"
  echo "node has $(cat {private}/data/a.txt)"
  sleep 3
""", cwd=str(root), scheduling={"partition": PARTITION})["job"]["id"]
            corral.wait_running(job, timeout=120)
            record = record_of(job)
            assert record is not None, list(home.rglob("mounts/*"))
            copies = [e for e in map(json.loads, (record / "made.jsonl").read_text().splitlines())
                      if e["kind"] == "copy"]
            assert len(copies) == 2, copies  # once per source for the job, not per replica
            done = corral.wait_job(job, timeout=120)
            log = corral.log(job)
            assert done["state"] == "SUCCEEDED", (done, log)
            assert log.count("read submitter's shard / submitter's cfg on") == 2, log
            assert log.count("node has node's own shard") == 2, log  # the nodes do not see the source
            assert len({r["node"] for r in corral.replicas(job).values()}) == 2
            for source in (f"{private}/data", f"{private}/cfg.txt"):  # by whichever replica's step came first
                assert log.count(f"corral: staged {source} for the Slurm nodes, which do not see it (") == 1, log
            wait_for(lambda: not record.exists() and not os.path.lexists(remote / "data"), timeout=30)
            assert not os.path.lexists(remote / "cfg.txt")

            if shutil.which("podman"):  # in a container the node's engine binds the staged copy too
                from container_lab import MARKER, ensure_image

                job = admin.submit(f"resources: {{image_id: docker:{ensure_image()}, accelerators: H100:1}}\n"
                                   f"file_mounts: {{/staged/data: {private}/data}}\n"
                                   f"run: test -e {MARKER} && echo \"boxed $(cat /staged/data/a.txt)\"\n",
                                   cwd=str(root), scheduling={"partition": PARTITION})["job"]["id"]
                done = corral.wait_job(job, timeout=180)
                log = corral.log(job)
                assert done["state"] == "SUCCEEDED", (done, log)
                assert "boxed submitter's shard" in log, log
                wait_for(lambda: record_of(job) is None, timeout=30)

            # another account's: her own file arrives (copied as her); a file of root's she may
            # not read is refused, never copied with the root server's rights
            job = client.submit(f"file_mounts: {{~/in: {private}/hers}}\nresources: {{accelerators: H100:1}}\n"
                                "run: cat ~/in/mine.txt; stat -c 'owner=%U' ~/in/mine.txt\n",
                                cwd="/", scheduling={"partition": PARTITION})["job"]["id"]
            done = corral.wait_job(job, timeout=120)
            log = corral.log(job)
            assert done["state"] == "SUCCEEDED", (done, log)
            assert "hers alone" in log and f"owner={ann.name}" in log, log
            wait_for(lambda: record_of(job) is None and not os.path.lexists(Path(ann.home) / "in"), timeout=30)

            job = client.submit(f"file_mounts: {{~/sec: {private}/shared}}\nresources: {{accelerators: H100:1}}\n"
                                "run: echo ran; cat ~/sec/secret.txt\n",
                                cwd="/", scheduling={"partition": PARTITION})["job"]["id"]
            done = corral.wait_job(job, timeout=120)
            log = corral.log(job)
            said = done.get("message") or ""
            assert done["state"] == "FAILED" and "ran" not in log.split(), (done, log)
            assert "file_mounts.~/sec: " in said and "Permission denied" in said and ann.name in said, (said, log)
            line = next((x for x in log.splitlines() if x.startswith("corral: file_mounts.~/sec: ")), "")
            assert line and line.removeprefix("corral: ") in said, (said, log)  # in her replica's log too
            assert not [p for p in home.rglob("secret.txt")], list(home.rglob("secret.txt"))
            wait_for(lambda: record_of(job) is None, timeout=30)

            # over the limit: refused at submission with the sentence, nothing stored
            from corral.client import InvalidRequest

            big = (f"file_mounts: {{{remote}/big: {private}/big}}\nresources: {{accelerators: H100:1}}\n"
                   "restart: {policy: on_failure, backoff: {initial: 0s}}\nrun: echo never\n")
            known = {j["id"] for j in admin.jobs(all=True)}
            with pytest.raises(InvalidRequest) as refused:
                admin.submit(big, cwd=str(root), scheduling={"partition": PARTITION})
            said = str(refused.value)
            assert f"file_mounts.{remote}/big: {private}/big is 2.0 MB, larger than the 1.0 MB" in said, said
            assert "infra.slurm.file_mounts_max_gb" in said, said
            assert {j["id"] for j in admin.jobs(all=True)} == known

            # within it when submitted, over it when its step starts (written meanwhile, in the
            # server's namespace): the step's own check fails the job at once with the sentence
            grown = f"{private}/grown"
            enter = ["nsenter", "-t", str(corral.server_pid()), "-m", "--", "sh", "-c"]
            subprocess.run([*enter, f"mkdir -p {grown} && echo small > {grown}/w.bin"], check=True)
            job = admin.submit(big.replace(f"{private}/big", grown), cwd=str(root),
                               scheduling={"partition": PARTITION, "hold": True})["job"]["id"]
            subprocess.run([*enter, f"head -c 2097152 /dev/zero > {grown}/w.bin"], check=True)
            admin.release(job)
            done = corral.wait_job(job, timeout=120)
            said = done.get("message") or ""
            assert done["state"] == "FAILED", (done, corral.log(job))
            assert f"file_mounts.{remote}/big: {grown} is 2.0 MB, larger than the 1.0 MB" in said, said
            assert "infra.slurm.file_mounts_max_gb" in said, said
            assert corral.replicas(job)[next(iter(corral.replicas(job)))]["restarts"] == 0
            assert "never" not in corral.log(job).split()
            wait_for(lambda: record_of(job) is None, timeout=30)
            assert not records.exists() or not any(records.iterdir()), list(records.rglob("*"))


SLURM_SITE = """
partitions:
  - {name: here, nodes: ["*"]}
  - {name: gpu, infra: slurm, slurm_partition: gpu}
infra: {slurm: {file_mounts_max_gb: 0.000001}}
"""  # about 1 KB


@pytest.fixture
def site_config() -> str:
    from conftest import POOL

    return POOL + SLURM_SITE


@pytest.fixture
def corral_home(site_config: str):
    """Corral's home on /dev/shm (a tmpfs), so that a source in the test's directory (another
    device, not a shared filesystem) is one the Slurm nodes may not see (``staging.must_stage``)."""
    import tempfile

    from conftest import shared_account

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here for a home on another device than the test's files")
    home = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="corral-test-home-"))
    try:
        (home / "config.yaml").write_text(site_config + shared_account(site_config))
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def unseen_source(corral_home: Path, tmp_path: Path) -> Path:
    """A directory of 64 KB the Slurm nodes may not see."""
    from corral.node.staging import must_stage

    source = tmp_path / "big"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(64 * 1024))
    if not must_stage(str(source), os.stat(corral_home).st_dev):
        pytest.skip(f"{tmp_path} is seen by the Slurm nodes here (corral's home's device or a shared filesystem)")
    return source


@pytest.mark.parametrize("lab", ["slurm"])  # (grouped with the lab's other tests, as above)
def test_a_source_over_the_slurm_staging_limit_is_refused_at_submission_and_nothing_is_stored(
        lab: str, server, unseen_source: Path) -> None:
    """``infra.slurm.file_mounts_max_gb`` is known when the job is submitted: a source larger is
    refused then (422, naming the mount, its size and the limit), not once the job has queued and
    its step starts; no job is stored. The same source on a partition of corral's own nodes
    (which see it) is taken."""
    from conftest import submit
    from conformance.harnesses import SlurmHarness

    why = SlurmHarness().why_unavailable()
    if why:
        pytest.skip(f"no usable Slurm here: {why}")
    spec = f"name: big\nfile_mounts: {{/data/big: {unseen_source}}}\nrun: echo never\n"
    response = server.post("/v1/jobs", json={"yaml": spec, "cwd": str(unseen_source),
                                             "scheduling": {"partition": "gpu"}})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    assert [e["field"] for e in errors] == ["file_mounts./data/big"], errors
    said = errors[0]["message"]
    assert f"{unseen_source} is 64.0 KB, larger than the 1.0 KB" in said, said
    assert "infra.slurm.file_mounts_max_gb" in said, said
    assert server.get("/v1/jobs").json() == []
    job = submit(server, spec.replace("echo never", "echo taken"), scheduling={"partition": "here"})
    assert job["partition"] == "here"
