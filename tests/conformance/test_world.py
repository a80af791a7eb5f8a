"""The replica's world on every infra (issue 31): it starts in the directory the job was
submitted from, with the submitter's variables (Slurm's ``--export=ALL``), and with nothing
of the environment of the shell that started the server — not on local processes, not in a
Ray actor, not in a Slurm step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.driver import Corral, wait_for
from conformance.harnesses import describe

SERVER_ONLY = "WORLD_TEST_SERVER_ONLY"  # no CORRAL_* name: no session-only rule may be what hides it


@pytest.fixture(scope="module")
def world(corral: Corral, tmp_path_factory) -> Corral:
    """The module's server started again from a shell of its own: a variable and a PATH entry
    only it has. The jobs are submitted from a shell without them."""
    marker = tmp_path_factory.mktemp("server-only-bin")
    corral("server", "stop")
    corral.close_client()
    submitter = dict(corral.env)
    corral.env = {**submitter, SERVER_ONLY: "leaked", "PATH": f"{marker}{os.pathsep}{submitter['PATH']}"}
    try:
        corral.start()
    finally:
        corral.env = {**submitter, "WORLD_TEST_MINE": "from the submitter"}
    corral.marker = str(marker)
    return corral


def _values(text: str) -> dict[str, str]:
    lines = [line.split("| ", 1)[-1] for line in text.splitlines()]
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_replica_starts_in_the_submit_directory_with_the_submitters_environment_only(
        world: Corral, work: Path, monkeypatch) -> None:
    monkeypatch.chdir(work)  # the directory `corral launch` is run from
    job = world.launch("world", f"""
run: |
  echo "cwd=$(pwd)"
  echo "mine=${{WORLD_TEST_MINE-unset}}"
  echo "server=${{{SERVER_ONLY}-unset}}"
  echo "path=$PATH"
""")
    done = world.wait_job(job, timeout=120)
    assert done["state"] == "SUCCEEDED", describe(done)
    seen = wait_for(lambda: (lambda v: v if "path" in v else None)(_values(world.log(job))), timeout=30,
                    what="the replica's lines in its log")
    assert seen["cwd"] == str(work), seen
    assert seen["mine"] == "from the submitter", seen
    assert seen["server"] == "unset", seen
    assert world.marker not in seen["path"], seen
    assert seen["path"] == world.env["PATH"], seen  # the submitter's PATH, as sbatch --export=ALL gives
    assert done["cwd"] == str(work) and done["export"] == "ALL", describe(done)


def test_export_none_carries_nothing_of_the_submitter_on_every_infra(world: Corral, work: Path, monkeypatch) -> None:
    monkeypatch.chdir(work)
    path = world.specs / "none.yaml"
    path.write_text('run: echo "mine=${WORLD_TEST_MINE-unset}"\n')
    job = int(world("launch", "-d", "-p", "conf", "--export=NONE", "--name", "none", str(path)).stdout.strip())
    done = world.wait_job(job, timeout=120)
    assert done["state"] == "SUCCEEDED", describe(done)
    seen = wait_for(lambda: (lambda v: v if "mine" in v else None)(_values(world.log(job))), timeout=30,
                    what="the replica's line in its log")
    assert seen["mine"] == "unset", seen


def test_a_working_directory_gone_before_the_start_fails_the_job_on_every_infra(world: Corral, work: Path) -> None:
    # submitted held, its directory removed, then released: it never runs elsewhere (Slurm's
    # own step would start in /tmp instead), and it says why
    gone = work / "gone-before-start"
    gone.mkdir()
    path = world.specs / "gone.yaml"
    path.write_text("run: echo ran-in=$(pwd)\n")
    job = int(world("launch", "-d", "-H", "-p", "conf", "--workdir", str(gone), "--name", "gone",
                    str(path)).stdout.strip())
    gone.rmdir()
    world("release", str(job))
    done = world.wait_job(job, timeout=120)
    assert done["state"] == "FAILED", describe(done)
    assert "ran-in=" not in world.log(job)
