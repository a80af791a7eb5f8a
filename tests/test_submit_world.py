"""The submitter's world travels with the job (issue 31, items 2 and 3): a job runs in the
directory it was submitted from, a relative ``workdir`` resolves against that directory (as
SkyPilot does, not against the YAML file's), ``--workdir``/``-D`` override it; its replicas
start from the submitter's environment by Slurm's ``--export`` rule (ALL by default, NONE, a
list, a config.yaml default), never with session-only variables and never with the server's
own environment. Through the real ``corral`` command and a real server."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest

from conftest import cli_for
from corral.spec.world import (MAX_TOTAL_BYTES, Export, check_environment, parse_export, select, session_only,
                               submitter_environment)

POOL = "nodes:\n  - {name: n, count: 1, gpus: 0, cpus: 4, memory: 8}\n"
SHOW = """run: |
  echo "cwd=$(pwd)"
  for v in MINE OTHER SERVER_ONLY SSH_AUTH_SOCK OLDPWD CORRAL_HOME JOBV A; do echo "$v=${!v-unset}"; done
  echo "PATH=$PATH"
"""


# -- the rules, without a server -----------------------------------------------------------------

def test_export_is_read_as_slurm_reads_it() -> None:
    assert parse_export("ALL") == Export(True)
    assert parse_export("none") == parse_export("NIL") == Export(False)
    assert parse_export("ALL,A=1,B") == Export(True, ("B",), (("A", "1"),))
    assert parse_export("A,B=x,y=2").values == (("B", "x"), ("y", "2"))
    assert parse_export("ALL,DIRS=/a,/b").values == (("DIRS", "/a,/b"),)  # a value may hold commas
    assert parse_export("A,B=2").text == "A,B=2" and parse_export("NONE").text == "NONE"
    for bad in ("", ",", "1A", "A-B"):
        with pytest.raises(ValueError):
            parse_export(bad)


def test_session_only_variables_are_not_sent_unless_named() -> None:
    environ = {"MINE": "1", "SSH_AUTH_SOCK": "/s", "OLDPWD": "/o", "PWD": "/p", "SHLVL": "2", "_": "/bin/x",
               "CORRAL_TOKEN": "secret", "SLURM_JOB_ID": "7", "DISPLAY": ":0", "TERM_SESSION_ID": "t",
               "PATH": "/bin"}
    assert submitter_environment(environ, None) == {"MINE": "1", "PATH": "/bin"}
    assert submitter_environment(environ, "NONE") == {}
    assert submitter_environment(environ, "SSH_AUTH_SOCK,MINE") == {"SSH_AUTH_SOCK": "/s", "MINE": "1"}
    assert session_only("SLURM_NTASKS") and session_only("CORRAL_SERVER") and not session_only("HOME")
    # the server applies the rule again (an older client, a raw HTTP submission) and the site's own list
    assert select(environ, Export(True), ("MI*",)) == {"PATH": "/bin"}
    assert select(environ, parse_export("MINE,SSH_AUTH_SOCK"), ("MI*",)) == {"SSH_AUTH_SOCK": "/s"}  # dropped, named


def test_an_environment_too_large_to_carry_is_refused_saying_why() -> None:
    assert check_environment({"A": "x"}) is None
    assert "KiB" in check_environment({"A": "x" * (200 * 1024)})
    many = {f"V{i}": "y" * 1000 for i in range(MAX_TOTAL_BYTES // 1000)}
    assert "--export=NONE" in check_environment(many)
    assert "not a valid variable name" in check_environment({"1A": "x"})


# -- through the corral command -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A server started from a shell whose environment the jobs must never see (SERVER_ONLY,
    its PATH), and a project directory with the YAML in a ``configs/`` folder."""
    base = tmp_path_factory.mktemp("world")
    home, project = base / "home", base / "project"
    home.mkdir()
    (project / "configs").mkdir(parents=True)
    (home / "config.yaml").write_text(POOL)
    server_bin = base / "server-only-bin"
    server_bin.mkdir()
    server = cli_for(home, {"SERVER_ONLY": "leaked", "PATH": f"{server_bin}{os.pathsep}{os.environ['PATH']}"},
                     cwd=base, timeout=120)
    server("server", "start", check=True)
    (project / "configs" / "show.yaml").write_text(SHOW + "envs:\n  JOBV: from-yaml\n")
    (project / "configs" / "dot.yaml").write_text(SHOW + "workdir: .\n")
    (project / "configs" / "sub.yaml").write_text(SHOW + "workdir: configs\n")
    (project / "show.sbatch").write_text("#!/bin/bash\n#SBATCH -J sb\n" + SHOW.split("|\n", 1)[1].replace("  ", ""))
    run = cli_for(home, {"MINE": "mine", "SSH_AUTH_SOCK": "/tmp/agent", "OLDPWD": "/elsewhere",
                         }, cwd=project, timeout=120)
    run.server_bin = server_bin
    yield run
    server.stop()


def seen(proc) -> dict[str, str]:
    """What the replica printed (its lines in ``corral launch``'s output, or a file)."""
    text = proc if isinstance(proc, str) else proc.stdout
    lines = [line.split("| ", 1)[-1] for line in text.splitlines()]
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_job_runs_in_the_submit_directory_and_relative_workdirs_resolve_against_it(world) -> None:
    project = world.work
    out = world("launch", "--name", "nodir", "configs/show.yaml", check=True)
    assert seen(out)["cwd"] == str(project)  # was: the YAML file's directory (configs/)
    out = world("launch", "--name", "dot", "configs/dot.yaml", check=True)
    assert seen(out)["cwd"] == str(project)  # `workdir: .` is where you are, as with `sky launch`
    out = world("launch", "--name", "sub", "configs/sub.yaml", check=True)
    assert seen(out)["cwd"] == str(project / "configs")  # refused before: configs/configs does not exist
    out = world("launch", "--name", "over", "--workdir", "configs", "configs/dot.yaml", check=True)
    assert seen(out)["cwd"] == str(project / "configs")
    status = json.loads(world("status", "over", "--json", check=True).stdout)
    assert status["cwd"] == str(project) and status["tasks"][0]["workdir"] == str(project / "configs")
    shown = world("status", "over", check=True).stdout
    assert f"submitted from {project}" in shown and "--export=ALL" in shown and "runs in" in shown


def test_a_workdir_that_does_not_exist_or_is_no_directory_is_refused_naming_the_field(world) -> None:
    refused = world("launch", "--workdir", "missing", "configs/show.yaml")
    assert refused.returncode == 2 and "--workdir" in refused.stderr and "does not exist" in refused.stderr
    (world.work / "afile").write_text("x")
    text = SHOW + "workdir: afile\n"
    (world.work / "configs" / "file.yaml").write_text(text)
    refused = world("launch", "configs/file.yaml")
    assert refused.returncode == 2 and "workdir" in refused.stderr and "is not a directory" in refused.stderr
    refused = world("sbatch", "-D", "nowhere", "show.sbatch")
    assert refused.returncode == 2 and "--chdir" in refused.stderr and "does not exist" in refused.stderr


def test_replicas_start_from_the_submitters_environment_never_the_servers(world) -> None:
    env = seen(world("launch", "--name", "all", "configs/show.yaml", check=True))
    assert env["MINE"] == "mine" and env["JOBV"] == "from-yaml"
    assert env["SERVER_ONLY"] == "unset" and str(world.server_bin) not in env["PATH"]
    assert env["PATH"] == world.env["PATH"]  # the submitter's PATH (their virtualenv), not the server's
    # session-only variables and corral's credentials stay with the session
    assert env["SSH_AUTH_SOCK"] == env["OLDPWD"] == env["CORRAL_HOME"] == "unset"


def test_export_none_and_lists_choose_what_is_carried(world) -> None:
    env = seen(world("launch", "--name", "none", "--export=NONE", "configs/show.yaml", check=True))
    assert env["MINE"] == "unset" and env["JOBV"] == "from-yaml"  # the job's own envs always
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a login's
    env = seen(world("launch", "--name", "list", "--export=SSH_AUTH_SOCK,A=1", "configs/show.yaml", check=True))
    assert env["SSH_AUTH_SOCK"] == "/tmp/agent" and env["A"] == "1" and env["MINE"] == "unset"
    refused = world("launch", "--export=NOT_SET_ANYWHERE", "configs/show.yaml")
    assert refused.returncode == 2 and "export" in refused.stderr and "NOT_SET_ANYWHERE" in refused.stderr
    assert "--export=SSH_AUTH_SOCK,A=…" in world("status", "list", check=True).stdout


def test_sbatch_keeps_an_exported_variable_and_runs_in_the_submit_directory(world) -> None:
    out = world("sbatch", "--wait", "-o", "sb.out", "show.sbatch")
    assert out.returncode == 0, out.stderr
    env = seen((world.work / "sb.out").read_text())
    assert env["MINE"] == "mine" and env["cwd"] == str(world.work) and env["SERVER_ONLY"] == "unset"
    out = world("sbatch", "--wait", "--export=NONE", "-D", "configs", "-o", "sb2.out", "show.sbatch")
    assert out.returncode == 0, out.stderr
    env = seen((world.work / "configs" / "sb2.out").read_text())
    assert env["MINE"] == "unset" and env["cwd"] == str(world.work / "configs")
    # SBATCH_EXPORT, sbatch's input variable, is the default the command line overrides
    quiet = cli_for(world.home, {"MINE": "mine", "SBATCH_EXPORT": "NONE"}, cwd=world.work, timeout=120)
    assert quiet("sbatch", "--wait", "-o", "sb3.out", "show.sbatch").returncode == 0
    assert seen((world.work / "sb3.out").read_text())["MINE"] == "unset"
    assert quiet("sbatch", "--wait", "--export=ALL", "-o", "sb4.out", "show.sbatch").returncode == 0
    assert seen((world.work / "sb4.out").read_text())["MINE"] == "mine"


def test_an_environment_too_large_is_refused_with_a_sentence(world) -> None:
    big = cli_for(world.home, {"HUGE": "x" * (100 * 1024), **{f"BIG{i}": "y" * (100 * 1024) for i in range(5)}},
                  cwd=world.work, timeout=120)
    refused = big("launch", "configs/show.yaml")
    assert refused.returncode == 2 and "environment" in refused.stderr and "--export=NONE" in refused.stderr
    assert big("launch", "--name", "small", "--export=NONE", "configs/show.yaml").returncode == 0


def test_the_sites_default_export_applies_when_the_submission_names_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL + "environment: {export: 'MINE', drop: [OTHER*]}\n")
    (tmp_path / "show.yaml").write_text(SHOW)
    run = cli_for(home, {"MINE": "mine", "OTHER": "o", "A": "a"}, cwd=tmp_path, timeout=120)
    try:
        env = seen(run("launch", "--name", "d", "show.yaml", check=True))
        assert env["MINE"] == "mine" and env["A"] == "unset"
        env = seen(run("launch", "--name", "e", "--export=ALL", "show.yaml", check=True))
        assert env["A"] == "a" and env["OTHER"] == "unset"  # the site never carries what it drops
        named = run("launch", "--name", "f", "--export=MINE,OTHER", "show.yaml", check=True)
        assert seen(named)["OTHER"] == "unset"
        assert "--export: OTHER is not carried: this site drops it" in named.stderr, named.stderr  # said, not silent
    finally:
        run.stop()


def test_the_api_names_the_field_of_a_bad_world(server) -> None:
    """Through HTTP, as any client would send it: each problem names its field, nothing is stored."""
    base = {"yaml": "run: echo hi\n", "cwd": "/"}
    for extra, field in (({"environment": {"1A": "x"}}, "environment"), ({"export": "A-B"}, "export"),
                         ({"export": "UNSET_HERE", "environment": {}}, "export"), ({"cwd": "rel"}, "cwd"),
                         ({"workdir": "/nonexistent-dir"}, "--workdir"),
                         ({"yaml": "run: echo\nworkdir: x\n", "cwd": None}, "workdir")):
        response = server.post("/v1/jobs", json={**base, **extra})
        assert response.status_code == 422, (extra, response.text[:300])
        assert any(e["field"] == field for e in response.json()["detail"]["errors"]), (extra, response.text)
    assert server.get("/v1/jobs", params={"all": True}).json() == []
    # a submission without a directory or environment: its tasks start in their user's home, from a
    # login's basics, never the server's own variables
    os.environ["WORLD_TEST_SERVER_VAR"] = "server"  # the in-process server's environment
    try:
        response = server.post("/v1/jobs", json={"yaml": 'run: echo "$(pwd) ${WORLD_TEST_SERVER_VAR-unset} $PATH"\n'})
        assert response.status_code == 201, response.text
        job = response.json()["job"]
        deadline = time.monotonic() + 60
        while server.get(f"/v1/jobs/{job['id']}").json()["state"] not in ("SUCCEEDED", "FAILED"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        words = server.get(f"/v1/jobs/{job['id']}/logs").text.split()
        try:
            home = pwd.getpwnam(job.get("run_as") or job["user"]).pw_dir  # the account it runs as
        except KeyError:  # no account of that name here: /
            home = "/"
        assert words[-3:] == [home, "unset", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    finally:
        del os.environ["WORLD_TEST_SERVER_VAR"]


def test_a_bad_environment_section_of_config_yaml_is_refused_naming_the_field(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec.loader import SpecError

    config = tmp_path / "config.yaml"
    for text, field in (("environment: {export: '1A'}\n", "environment.export"),
                        ("environment: {drop: ['A B']}\n", "environment.drop"),
                        ("environment: {exports: ALL}\n", "environment.exports")):
        config.write_text(text)
        with pytest.raises(SpecError) as refused:
            load_site(config)
        assert any(i.field.startswith(field) for i in refused.value.issues), refused.value
    config.write_text("environment: {export: 'all,A=1'}\n")
    assert load_site(config).environment.export == "ALL,A=1"
