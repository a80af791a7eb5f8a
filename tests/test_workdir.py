"""Where a job runs: SkyPilot's git ``workdir: {url, ref}`` cloned once per job on the node
its replicas run on (real git, a local repository, real processes)."""

from __future__ import annotations

from conftest import submit, wait_state
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("flock") is None,
                                reason="git and flock (util-linux) are needed to clone a git workdir")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(repo.parent), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "version.txt").write_text("one\n")
    _git(repo, "add", "version.txt")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "tag", "v1")
    (repo / "version.txt").write_text("two\n")
    _git(repo, "commit", "-q", "-am", "two")
    return repo


def test_a_git_workdir_is_cloned_once_per_job_at_its_ref(server, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job = submit(server, f"""
name: fromgit
num_nodes: 2
workdir: {{url: "file://{repo}", ref: v1}}
run: cat version.txt > {out}/$CORRAL_REPLICA; pwd > {out}/pwd-$CORRAL_REPLICA
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    logs = server.get(f"/v1/jobs/{job['id']}/logs").text
    assert done["state"] == "SUCCEEDED", logs
    assert (out / "0").read_text() == (out / "1").read_text() == "one\n"  # the tag, not the branch head
    assert (out / "pwd-0").read_text() == (out / "pwd-1").read_text()  # one clone on the node, shared
    assert logs.count("corral: cloning") == 1
    again = submit(server, f"name: head\nworkdir: {{url: 'file://{repo}'}}\nrun: cat version.txt > {out}/head\n")
    assert wait_state(server, again["id"], "SUCCEEDED", "FAILED", timeout=30)["state"] == "SUCCEEDED"
    assert (out / "head").read_text() == "two\n"  # no ref: the default branch
    assert not Path((out / "pwd-0").read_text().strip()).exists()  # removed with its ended job


def test_a_clone_that_fails_fails_the_replica_with_the_reason_in_its_log(server, tmp_path: Path, repo: Path) -> None:
    for workdir, words in ((f"{{url: 'file://{tmp_path}/missing'}}", "could not clone"),
                           (f"{{url: 'file://{repo}', ref: no-such-tag}}", "could not clone")):
        job = submit(server, f"workdir: {workdir}\nrun: echo never\n")
        done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
        logs = server.get(f"/v1/jobs/{job['id']}/logs").text
        assert done["state"] == "FAILED" and done["exit_code"] != 0
        assert words in logs and "never" not in logs


def test_a_bad_git_workdir_is_refused_with_its_field(server) -> None:
    for text, field in (("workdir: {url: '-uoops'}\nrun: x\n", "workdir.url"),
                        ("workdir: {url: x, ref: '../../etc'}\nrun: x\n", "workdir.ref"),
                        ("workdir: {uri: x}\nrun: x\n", "workdir.uri")):
        response = server.post("/v1/jobs", json={"yaml": text})
        assert response.status_code == 422, text
        assert field in [e["field"] for e in response.json()["detail"]["errors"]], response.text
