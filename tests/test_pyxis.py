"""Pyxis's container options in batch scripts run by ``corral sbatch``: the pure mapping
(enroot image references, mounts, flags, refusals naming the option and the script line),
and end to end on the local infra with the busybox test image (``container_lab``): an
``srun --container-image … --container-mounts …`` step that sees its mount and the image,
``#SBATCH --container-image`` running the whole script inside, a ``--container-name`` kept
for the job's later steps, and the engine options a step's container gets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import POOL, cli_for
from corral.node import stepcontainer
from corral.node.srun import parse_args
from corral.spec import pyxis
from corral.spec.loader import SpecError
from corral.spec.pyxis import Mount, PyxisError, StepContainer, container_of, registry_reference, split
from corral.spec.sbatch import load_batch


# -- image references -------------------------------------------------------------------------

@pytest.mark.parametrize("given, reference, user", [
    ("nvcr.io#nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3", None),
    ("ubuntu", "docker.io/library/ubuntu", None),
    ("ubuntu:22.04", "docker.io/library/ubuntu:22.04", None),
    ("docker://ubuntu:22.04", "docker.io/library/ubuntu:22.04", None),
    ("registry-1.docker.io#ubuntu", "docker.io/library/ubuntu", None),
    ("myteam/trainer:v3", "docker.io/myteam/trainer:v3", None),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3", None),  # enroot's credentials guess
    ("$oauthtoken@nvcr.io#nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3", "$oauthtoken"),
    ("ann@127.0.0.1:5000#team/img:1", "127.0.0.1:5000/team/img:1", "ann"),
    ("localhost/corral-test/busybox:abc", "localhost/corral-test/busybox:abc", None),
    ("host:5000/x", "host:5000/x", None),  # a registry with its port, as Docker writes it
    ("localhost:5000/x:1", "localhost:5000/x:1", None),
    ("ann@127.0.0.1:5000/team/img:1", "127.0.0.1:5000/team/img:1", "ann"),
])
def test_enroot_image_references_become_registry_references(given: str, reference: str, user: str | None) -> None:
    assert registry_reference(given) == (reference, user)


@pytest.mark.parametrize("given, words", [
    ("/shared/images/pytorch.sqsh", "squashfs image file"),
    ("./pytorch.sqsh", "squashfs image file"),
    ("Ubuntu", "not an enroot image"),
    ("dockerd://ubuntu", "local Docker daemon"),
    ("", "names no image"),
])
def test_images_podman_cannot_run_are_refused_naming_the_option(given: str, words: str) -> None:
    with pytest.raises(PyxisError) as err:
        registry_reference(given)
    assert err.value.option == "--container-image" and words in str(err.value)


# -- srun's options ---------------------------------------------------------------------------

def test_pyxis_options_are_taken_out_of_srun_s_arguments_and_mapped() -> None:
    argv = ["-N", "2", "--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--ntasks-per-node", "1",
            "--container-mounts=/data:/data:ro,/scratch:/work,tmpfs:/cache", "--container-workdir", "/work",
            "--container-name=tf", "--container-env=PATH,HF_TOKEN", "--container-mount-home",
            "--container-remap-root", "--container-readonly", "-l", "python", "train.py", "--container-image=x"]
    given, rest = split(argv)
    assert rest == ["-N", "2", "--ntasks-per-node", "1", "-l", "python", "train.py", "--container-image=x"]
    opts, command = parse_args(rest)
    assert opts == {"nodes": "2", "ntasks-per-node": "1", "label": "1"} and command == ["python", "train.py",
                                                                                       "--container-image=x"]
    box = container_of(given)
    assert box == StepContainer(
        image="nvcr.io/nvidia/pytorch:24.05-py3", mounts=(Mount("/data", "/data", ("ro",)), Mount("/scratch", "/work"),
                                                          Mount("tmpfs", "/cache")),
        workdir="/work", name="tf", env=("PATH", "HF_TOKEN"), mount_home=True, remap_root=True, writable=False)
    assert StepContainer.from_json(box.to_json()) == box


def test_a_step_container_s_engine_options(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    box = container_of({"container-image": "ubuntu",
                        "container-mounts": f"{tmp_path / 'data'}:/data:ro,./data:/rw,tmpfs:/cache",
                        "container-workdir": "/data", "container-readonly": True, "container-env": "HF_HOME"})
    options = stepcontainer.engine_options(box, str(tmp_path), {"CORRAL_LAUNCH_KEY": "7.batch.0.a1",
                                                                "HOME": str(tmp_path)})
    text = " ".join(options)
    assert f"-v {tmp_path / 'data'}:/data:ro" in text and f"-v {tmp_path / 'data'}:/rw " in text + " "
    assert "--tmpfs /cache" in text and "-w /data" in text and "--read-only" in text
    assert "--env HF_HOME" in text and "--label corral.attempt=7.batch.0.a1" in text
    assert options[options.index("--entrypoint") + 1] == ""  # as Pyxis: the image's entrypoint is not run
    assert f"{tmp_path}:{tmp_path}" not in text  # no home unless --container-mount-home
    home = container_of({"container-image": "ubuntu", "container-mount-home": True, "container-entrypoint": True})
    options = stepcontainer.engine_options(home, "/", {"HOME": str(tmp_path)})
    assert f"{tmp_path}:{tmp_path}" in options and "--entrypoint" not in options
    with pytest.raises(stepcontainer.StepContainerError, match="does not exist"):
        stepcontainer.engine_options(container_of({"container-image": "ubuntu",
                                                   "container-mounts": "/no/such/dir:/x"}), "/", {})


@pytest.mark.parametrize("given, option, words", [
    ({"container-image": "ubuntu", "container-mounts": "/a:/b:ro:x"}, "--container-mounts", "not SRC:DST"),
    ({"container-image": "ubuntu", "container-mounts": "/a:/b:noexec"}, "--container-mounts", "mount flag 'noexec'"),
    ({"container-image": "ubuntu", "container-mounts": "umount:/b"}, "--container-mounts", "unmounting"),
    ({"container-image": "ubuntu", "container-mounts": "/a:/b:ro+rw"}, "--container-mounts", "ro and rw"),
    ({"container-image": "ubuntu", "container-save": "/x.sqsh"}, "--container-save", "squashfs"),
    ({"container-image": "ubuntu", "container-workdir": "work"}, "--container-workdir", "absolute path"),
    ({"container-image": "ubuntu", "container-env": "A,1B"}, "--container-env", "'1B'"),
    ({"container-image": "ubuntu", "container-name": "tf:sometimes"}, "--container-name", "auto, create"),
    ({"container-image": "ubuntu", "container-writable": True, "container-readonly": True},
     "--container-readonly", "both"),
    ({"container-workdir": "/w"}, "--container-workdir", "needs --container-image"),
])
def test_malformed_container_options_are_refused_naming_the_option(given, option: str, words: str) -> None:
    with pytest.raises(PyxisError) as err:
        container_of(given)
    assert err.value.option == option and words in err.value.message


def test_a_user_at_image_takes_its_password_from_enroot_s_credentials_or_the_job_s_environment(tmp_path) -> None:
    (tmp_path / ".credentials").write_text("machine nvcr.io login $oauthtoken password $NGC_KEY\n"
                                           "machine 127.0.0.1 login ann password plain\n")
    env = {"ENROOT_CONFIG_PATH": str(tmp_path), "NGC_KEY": "nvapi-123"}
    ngc = container_of({"container-image": "$oauthtoken@nvcr.io#nvidia/pytorch:24.05-py3"})
    assert stepcontainer.login_for(ngc, env, ngc.image) == ("nvcr.io", "$oauthtoken", "nvapi-123")
    local = container_of({"container-image": "ann@127.0.0.1:5000#team/img:1"})
    assert stepcontainer.login_for(local, env, local.image) == ("127.0.0.1:5000", "ann", "plain")
    bob = container_of({"container-image": "bob@127.0.0.1:5000#team/img:1"})
    sky = {"SKYPILOT_DOCKER_USERNAME": "bob", "SKYPILOT_DOCKER_PASSWORD": "pw"}
    assert stepcontainer.login_for(bob, sky, bob.image) == ("127.0.0.1:5000", "bob", "pw")
    with pytest.raises(stepcontainer.StepContainerError, match="no password for bob at 127.0.0.1:5000"):
        stepcontainer.login_for(bob, env, bob.image)
    # a line naming the host with its port, as the hint when none matches says to write it
    (tmp_path / ".credentials").write_text("machine 127.0.0.1:5000 login cid password withport\n")
    cid = container_of({"container-image": "cid@127.0.0.1:5000#team/img:1"})
    assert stepcontainer.login_for(cid, env, cid.image) == ("127.0.0.1:5000", "cid", "withport")
    plain = container_of({"container-image": "127.0.0.1:5000#team/img:1"})
    assert stepcontainer.login_for(plain, {}, plain.image) is None
    assert stepcontainer.login_for(plain, sky, plain.image) == ("127.0.0.1:5000", "bob", "pw")


def test_a_site_with_pyxis_takes_the_options_itself() -> None:
    assert pyxis.pass_through("      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n  [pyxis] the image")
    assert not pyxis.pass_through("Usage: srun [OPTIONS(0)...]\n  -N, --nodes=N")


SLURM_HELP = """Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]] [ : [OPTIONS(N)...]] executable(N) [args(N)...]

Parallel run options:
  -A, --account=name          charge job to specified account
  -N, --nodes=N               number of nodes on which to run (N = min[-max])
  -o, --output=out            location of stdout redirection
      --export=env_vars|NONE  environment variables passed to launcher with
      --exclusive[=user|mcs]  allocate nodes in exclusive mode when
  -l, --label                 prepend task number to lines of stdout/err
      --container             Path to OCI container bundle
"""
PYXIS_HELP = SLURM_HELP + """
Options provided by plugins:
      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
                              [pyxis] the image to use for the container
"""


def _fake_srun(directory: Path, help_text: str) -> Path:
    directory.mkdir()
    (directory / "help.txt").write_text(help_text)
    (directory / "srun").write_text(f'#!/bin/sh\n[ "$1" = --help ] && exec /bin/cat {directory / "help.txt"}\nexit 3\n')
    (directory / "srun").chmod(0o755)
    return directory / "srun"


def test_on_slurm_pyxis_s_options_go_to_slurm_s_srun_only_where_the_site_has_pyxis(tmp_path: Path) -> None:
    """A batch script's srun on a Slurm infra (``node.slurmstep``): Slurm's own srun (the next
    one on PATH after corral's) gets the line untouched where its --help lists Pyxis's
    options; elsewhere Slurm's srun keeps its own options (values read from its --help) and
    each task runs the command in its container through corral."""
    from corral.node import slurmstep

    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "srun").write_text("#!/bin/sh\nexit 9\n")
    (ours / "srun").chmod(0o755)
    argv = ["-N", "2", "-o", "out.%t", "--exclusive", "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
            "--container-mounts", "/data:/data:ro", "--container-name=tf:create", "-l", "--export", "ALL,A=1",
            "python", "train.py", "--container-image=x"]
    env = {"PATH": f"{ours}:{tmp_path / 'pyxis'}", "CORRAL_JOB_ID": "7", "CORRAL_CONTAINER_ENGINE": "podman"}
    pyxis_srun = _fake_srun(tmp_path / "pyxis", PYXIS_HELP)
    assert slurmstep.plan(argv, env, str(ours)) == [str(pyxis_srun), *argv]
    plain_srun = _fake_srun(tmp_path / "plain", SLURM_HELP)
    env["PATH"] = f"{ours}:{tmp_path / 'plain'}"
    final = slurmstep.plan(argv, env, str(ours))
    assert final[:8] == [str(plain_srun), "-N", "2", "-o", "out.%t", "--exclusive", "-l", "--export"], final
    assert final[8] == "ALL,A=1" and final[10:12] == [str(Path(slurmstep.__file__).with_name("srun.py")),
                                                      "task-container"], final
    assert final[13:] == ["python", "train.py", "--container-image=x"], final
    blob = json.loads(final[12])
    box = StepContainer.from_json(json.dumps(blob["container"]))
    assert box.image == "nvcr.io/nvidia/pytorch:24.05-py3" and box.mounts == (Mount("/data", "/data", ("ro",)),)
    assert (box.name, box.name_flag) == ("tf", "create")
    assert blob["context"] == {"CORRAL_JOB_ID": "7", "CORRAL_CONTAINER_ENGINE": "podman"}
    assert slurmstep.plan(["-N", "1", "hostname"], env, str(ours)) == [str(plain_srun), "-N", "1", "hostname"]
    with pytest.raises(PyxisError) as err:
        slurmstep.plan(["--container-image=/x.sqsh", "true"], env, str(ours))
    assert err.value.option == "--container-image"


# -- batch scripts ------------------------------------------------------------------------------

def test_sbatch_container_directives_put_the_script_in_that_container() -> None:
    job = load_batch("#!/bin/sh\n#SBATCH --container-image=nvcr.io#nvidia/pytorch:24.05-py3\n"
                     "#SBATCH --container-mounts=/data:/data:ro\n#SBATCH --container-workdir=/data\necho\n",
                     source="x.sbatch")
    box = StepContainer.from_json(json.dumps(job.documents[0]["sbatch"]["container"]))
    assert box.image == "nvcr.io/nvidia/pytorch:24.05-py3" and box.workdir == "/data"
    assert box.mounts == (Mount("/data", "/data", ("ro",)),)
    assert "container" not in load_batch("#!/bin/sh\n#SBATCH -N1\necho\n", source="x.sbatch").documents[0]["sbatch"]


@pytest.mark.parametrize("text, line, option, words", [
    ("#!/bin/sh\n#SBATCH -N 1\nsrun --container-image=/images/pt.sqsh python x.py\n", 3, "--container-image",
     "squashfs"),
    ("#!/bin/sh\n#SBATCH -N 1\necho start\nif true; then srun -n1 --container-image ubuntu \\\n"
     "  --container-mounts=/a:/b:ro:x true; fi\n", 4, "--container-mounts", "not SRC:DST"),
    ("#!/bin/sh\n#SBATCH -N 1\nsrun --container-image=ubuntu --container-save=/x.sqsh true\n", 3,
     "--container-save", "squashfs"),
    ("#!/bin/sh\n#SBATCH --container-image=/x.sqsh\necho\n", 2, "--container-image", "squashfs"),
    ("#!/bin/sh\n#SBATCH --container-mounts=/a:/b\necho\n", 2, "--container-mounts", "needs --container-image"),
])
def test_container_mistakes_in_a_script_are_refused_with_their_option_and_line(text, line, option, words) -> None:
    with pytest.raises(SpecError) as err:
        load_batch(text, source="x.sbatch")
    issue = err.value.issues[0]
    assert (issue.line, issue.field) == (line, option) and words in issue.message, str(err.value)


def test_a_container_option_the_shell_makes_at_run_time_is_checked_then() -> None:
    job = load_batch('#!/bin/sh\n#SBATCH -N 1\nfor i in 1 2; do srun --container-name="n$i" --container-image="$IMG" '
                     'true; done\n', source="x.sbatch")
    assert not job.warnings


def test_srun_inside_a_containerised_script_is_warned_about() -> None:
    job = load_batch("#!/bin/sh\n#SBATCH --container-image=ubuntu\nsrun --container-image=ubuntu true\n",
                     source="x.sbatch")
    assert any("line 3" in w and "srun is not available" in w for w in job.warnings)


# -- end to end, on the local infra's Podman -----------------------------------------------------

def _cli(home: Path, cwd: Path):
    """The CLI against a server of ``home`` whose batch scripts' srun runs this tree's corral
    (none of this process's SLURM_* variables)."""
    import corral as package
    root = str(Path(package.__file__).resolve().parents[1])
    pythonpath = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    run = cli_for(home, {"PYTHONPATH": pythonpath}, cwd=cwd, timeout=120)
    for name in [k for k in run.env if k.startswith("SLURM_")]:
        del run.env[name]
    return run


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    from container_lab import SITE, ensure_image

    image = ensure_image()
    work = tmp_path_factory.mktemp("pyxis")
    home = work / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL + SITE)
    run = _cli(home, work)
    run.image = image
    yield run
    run.stop()


def _until(corral, job_id: str, text: str, what: str = "logs", timeout: float = 60) -> str:
    """The job's log (or events) once ``text`` is in it."""
    import time

    deadline = time.monotonic() + timeout
    while text not in (said := corral(what, job_id).stdout):
        assert time.monotonic() < deadline, said
        time.sleep(0.2)
    return said


def test_an_srun_step_runs_in_its_container_with_its_mounts(corral) -> None:
    from container_lab import MARKER, containers_of

    data = corral.work / "data"
    data.mkdir()
    (data / "input.txt").write_text("from the node\n")
    out = corral.work / "out"
    out.mkdir()
    registry, _, rest = corral.image.partition("/")
    (corral.work / "step.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
test -e {MARKER} && echo "batch shell inside" || echo "batch shell on the node"
srun --container-image={registry}#{rest} --container-mounts={data}:/data:ro,{out}:/out \\
  sh -c 'cat /data/input.txt > /out/seen.$SLURM_PROCID; cat {MARKER} >> /out/seen.$SLURM_PROCID;
         touch /data/x 2>/dev/null || echo read-only >> /out/seen.$SLURM_PROCID;
         echo "$SLURMD_NODENAME $SLURM_STEP_ID" >> /out/seen.$SLURM_PROCID'
echo "step exit $?"
""")
    proc = corral("sbatch", "--wait", "step.sbatch")
    job_id = proc.stdout.split()[-1]
    log = corral("logs", job_id).stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    assert "batch shell on the node" in log and "step exit 0" in log
    seen = [(out / f"seen.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert all(s[:3] == ["from the node", "inside", "read-only"] for s in seen), seen
    assert seen[0][3] != seen[1][3] and seen[0][3].endswith(" 0")  # two nodes, one step (id 0)
    assert not [n for n in containers_of("step")], "a step's containers are removed with it"


def test_sbatch_container_image_runs_the_whole_script_inside(corral) -> None:
    from container_lab import MARKER

    out = corral.work / "whole"
    out.mkdir()
    (corral.work / "whole.sbatch").write_text(f"""#!/bin/sh
#SBATCH --container-image={corral.image}
#SBATCH --container-mounts={out}:/results
#SBATCH --container-workdir=/results
cat {MARKER} > seen.txt
echo "$SLURM_JOB_ID $1 $(pwd)" >> seen.txt
""")
    proc = corral("sbatch", "--wait", "whole.sbatch", "arg1")
    job_id = proc.stdout.split()[-1]
    assert proc.returncode == 0, proc.stdout + proc.stderr + corral("logs", job_id).stdout
    assert (out / "seen.txt").read_text().splitlines() == ["inside", f"{job_id} arg1 /results"]


def test_a_named_container_keeps_its_files_for_the_job_s_later_steps(corral) -> None:
    """--container-name, as Pyxis keeps it: a later step naming it (without an image) runs over
    the files an earlier one wrote in it, on the same node; another node has its own; the
    name is the job's, gone when it ends."""
    import time

    (corral.work / "named.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
echo "kept in $CORRAL_NAMED_CONTAINERS"
srun -N1 --container-image={corral.image} --container-name=tf sh -c 'echo "written by step $SLURM_STEP_ID" > /kept'
echo "first $?"
srun -N1 --container-name=tf sh -c 'cat /kept; test -e /corral-image && echo "image files there"'; echo "second $?"
srun -N2 --container-image={corral.image} --container-name=tf:auto \\
  sh -c 'cat /kept 2>/dev/null || echo "none on $SLURMD_NODENAME"' | sort
srun -N1 --container-name=tf:create true; echo "create $?"
srun -N1 --container-name=other true; echo "other $?"
srun --container-image=localhost/corral-test/none:1 true; echo "third $?"
exit 3
""")
    proc = corral("sbatch", "--wait", "named.sbatch")
    job_id = proc.stdout.split()[-1]
    log = corral("logs", job_id).stdout
    assert proc.returncode == 3, log  # a failed job: its named containers go with it all the same
    assert "first 0" in log and "second 0" in log, log
    lines = [line.split(" | ", 1)[-1] for line in log.splitlines()]
    assert "written by step 0\nimage files there\n" in "\n".join(lines), log  # step 0's file, in step 1's container
    assert lines.count("written by step 0") == 2, log  # by step 1, and by step 2 on the first node
    assert any(line.startswith("none on ") for line in lines), log  # the second node has a container of its own
    assert "create 1" in log and "this job already has a container tf on node" in log, log
    assert "other 1" in log and "no container other on node" in log, log
    assert "third 1" in log and "could not pull localhost/corral-test/none:1" in log, log
    kept = Path(next(line for line in lines if line.startswith("kept in ")).split(" ", 2)[2])
    assert kept.is_relative_to(corral.home), kept  # on disk in the home, never the runtime directory's memory
    deadline = time.monotonic() + 30
    while kept.exists():  # removed with the job's directory when it ended
        assert time.monotonic() < deadline, f"{kept} outlived the job"
        time.sleep(0.2)


def test_a_cancelled_job_s_named_container_is_removed(corral) -> None:
    import time

    (corral.work / "named-long.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 1
srun --container-image={corral.image} --container-name=tf sh -c 'echo x > /kept'
echo "kept in $CORRAL_NAMED_CONTAINERS"
srun --container-name=tf sleep 300
""")
    job_id = corral("sbatch", "named-long.sbatch", check=True).stdout.split()[-1]
    log = _until(corral, job_id, "kept in ", timeout=60)
    kept = Path(log.split("kept in ", 1)[1].split()[0])
    assert (kept / "index").exists(), log
    corral("cancel", job_id, check=True)
    deadline = time.monotonic() + 30
    while kept.exists():
        assert time.monotonic() < deadline, f"{kept} outlived the cancelled job"
        time.sleep(0.2)


def test_cancel_leaves_no_step_container(corral) -> None:
    import time

    from container_lab import containers_of

    (corral.work / "long.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 1
srun --container-image={corral.image} sleep 300
""")
    job_id = corral("sbatch", "long.sbatch", check=True).stdout.split()[-1]
    deadline = time.monotonic() + 60
    while not containers_of("step"):
        assert time.monotonic() < deadline, corral("logs", job_id).stdout
        time.sleep(0.2)
    corral("cancel", job_id, check=True)
    deadline = time.monotonic() + 60
    while containers_of("step"):
        assert time.monotonic() < deadline, f"left running: {containers_of('step')}"
        time.sleep(0.2)


def test_a_step_container_whose_client_was_killed_is_removed_when_its_job_ends(corral) -> None:
    import time

    from container_lab import containers_of

    # the step's client dies with SIGKILL (as after a grace period ran out) while its container
    # runs: the container is no process of the job's, and is removed when the attempt ends
    (corral.work / "orphan.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 1
srun --container-image={corral.image} sleep 300 &
client=$!
for i in $(seq 100); do [ -n "$(podman ps -q --filter label=corral.attempt=$CORRAL_LAUNCH_KEY)" ] && break; sleep 0.2; done
kill -9 $client
echo "client killed"
""")
    job_id = corral("sbatch", "orphan.sbatch", check=True).stdout.split()[-1]
    _until(corral, job_id, "client killed", timeout=90)
    deadline = time.monotonic() + 60
    while containers_of("step"):
        assert time.monotonic() < deadline, f"left running: {containers_of('step')}"
        time.sleep(0.2)


@pytest.fixture
def gated(tmp_path: Path):
    """A server whose node engine is podman, except that looking for an image tagged
    ``gated`` waits until the test opens the gate: a pull that takes as long as a test needs."""
    import subprocess

    from container_lab import SITE, ensure_image, need_podman

    home = tmp_path / "home"
    home.mkdir()
    engine = tmp_path / "gated-podman"
    engine.write_text(f'#!/bin/sh\ncase "$1 $2 $3" in "image exists "*:gated)\n'
                      f'  touch {tmp_path}/waiting; while [ ! -e {tmp_path}/gate ]; do sleep 0.1; done;; esac\n'
                      f'exec {need_podman()} "$@"\n')
    engine.chmod(0o755)
    (home / "config.yaml").write_text(POOL + SITE + f"  engine: {engine}\n")
    run = _cli(home, tmp_path)
    run.image = ensure_image().rsplit(":", 1)[0] + ":gated"
    subprocess.run([need_podman(), "tag", ensure_image(), run.image], check=True)
    yield run
    (tmp_path / "gate").touch()
    run.stop()


def test_a_batch_script_is_starting_while_its_container_s_image_is_pulled(gated) -> None:
    """As a replica with ``image_id``: the batch script's replica is STARTING, and says it
    pulls, until its container can run; then RUNNING, and the script runs inside."""
    import time

    from container_lab import MARKER

    corral = gated
    (corral.work / "gated.sbatch").write_text(f"#!/bin/sh\n#SBATCH --container-image={corral.image}\ncat {MARKER}\n")
    job_id = corral("sbatch", "gated.sbatch", check=True).stdout.split()[-1]

    def replica() -> dict:
        return json.loads(corral("status", job_id, "--json", check=True).stdout)["tasks"][0]["replicas"][0]

    _until(corral, job_id, "batch script's container runs", "events")
    seen = [replica() for _ in range(3)]  # the gate is shut: however long it takes, no further
    assert {r["state"] for r in seen} == {"STARTING"}, seen
    assert seen[-1]["reason"].startswith(f"pulling image {corral.image}"), seen
    assert "PULLING" in corral("status", job_id).stdout
    (corral.work / "gate").touch()
    deadline = time.monotonic() + 60
    while (done := json.loads(corral("status", job_id, "--json", check=True).stdout))["state"] not in (
            "SUCCEEDED", "FAILED", "CANCELLED"):
        assert time.monotonic() < deadline, done
        time.sleep(0.2)
    assert done["state"] == "SUCCEEDED", corral("events", job_id).stdout + corral("logs", job_id).stdout
    assert "inside" in corral("logs", job_id).stdout
    assert "its batch script's image is here" in corral("events", job_id).stdout  # running once it was


def test_a_step_stopped_while_its_image_is_pulled_starts_no_task(gated) -> None:
    """A stop signal that reaches srun before its tasks start (here: while its image is being
    pulled) is not lost: no task starts, srun says so and exits 128+15, as the rest of the
    job's processes do within their grace (the signal would otherwise reach nothing, and the
    task run until corral's SIGKILL)."""
    import time

    corral = gated
    out = corral.work / "out"
    out.mkdir()
    (corral.work / "early.sbatch").write_text(f"""#!/bin/bash
srun --container-image={corral.image} --container-mounts={out}:{out} touch {out}/ran &
until [ -e {corral.work}/waiting ]; do sleep 0.1; done
kill -TERM $!
echo "stopped srun"
wait $!
echo "srun exit $?"
""")
    job_id = corral("sbatch", "early.sbatch", check=True).stdout.split()[-1]
    _until(corral, job_id, "stopped srun")
    (corral.work / "gate").touch()
    log = _until(corral, job_id, "srun exit")
    assert "srun exit 143" in log and "stopped (SIGTERM) before its tasks started" in log, log
    time.sleep(1)
    assert not (out / "ran").exists(), log


def test_a_batch_script_whose_image_cannot_be_pulled_says_why_in_its_job_s_message(corral) -> None:
    import json

    (corral.work / "noimage.sbatch").write_text("#!/bin/bash\n#SBATCH --container-image=localhost/corral-test/none:1\n"
                                                "echo never\n")
    proc = corral("sbatch", "--wait", "noimage.sbatch")
    job_id = proc.stdout.split()[-1]
    done = json.loads(corral("status", job_id, "--json", check=True).stdout)
    assert done["state"] == "FAILED", done
    assert "could not pull localhost/corral-test/none:1" in (done.get("message") or ""), done  # not "exit code 1" alone


def test_a_step_stopped_while_its_image_is_pulled_leaves_none_of_its_files(tmp_path: Path) -> None:
    import shutil
    import signal
    import subprocess
    import sys
    import time

    # a node whose engine takes long to pull: the step is stopped during the pull; its files
    # (the container's environment, secrets included) must not stay behind in the node's /tmp
    slow = tmp_path / "bin" / "podman"
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\nif [ "$1" = pull ]; then exec sleep 60; fi\n'
                    f'if [ "$1" = image ]; then exit 1; fi\nexec {shutil.which("podman") or "false"} "$@"\n')
    slow.chmod(0o755)
    temp = tmp_path / "tmp"
    temp.mkdir()
    box = container_of({"container-image": "127.0.0.1:5999#never/pulled:1"})
    code = ("import json, os, sys; from corral.node import stepcontainer; from corral.spec.pyxis import StepContainer\n"
            "sys.exit(stepcontainer.run(StepContainer.from_json(sys.argv[1]), 'k1', dict(os.environ), ['true']))")
    env = {**os.environ, "TMPDIR": str(temp), "CORRAL_CONTAINER_ENGINE": str(slow), "MY_SECRET": "s3cr3t",
           "PATH": f"{slow.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-c", code, box.to_json()], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not list(temp.glob("corral-step-*/pull")):  # its files are written, its pull has begun
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(temp.glob("corral-step-*")) == []
