"""Replicas in containers (``resources.image_id: docker:IMAGE``) on a real Slurm (the
slurm-lab), started through the Slurm executor: each replica is a step whose wrapper runs the
node's Podman, with the offline test image (``container_lab``).

* inside, a replica has its environment, including what Slurm sets only when the step starts
  (``SLURM_PROCID``, its GRES binding's ``CUDA_VISIBLE_DEVICES``: passed through then), and
  its corral name resolves to its own server;
* cancel ends the Slurm job and leaves no container;
* a replica whose image is being pulled (an engine slow to pull, a private registry) is
  STARTING, and RUNNING once its container runs; a pull the registry refuses fails the
  replica with its words, without a restart.

Skipped, with the reason, where no Slurm answers or the machine cannot run containers."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import cli_for, wait_for
from container_lab import GRACED, IMAGE, MARKER, SITE as CONTAINERS, containers_of, ensure_image, start_registry
from test_slurm import ENV, _squeue_ids, _why_no_slurm

SITE = """
partitions:
  - {name: here, nodes: ["*"]}
  - {name: gpu, infra: slurm, slurm_partition: gpu}
""" + CONTAINERS


@pytest.fixture(autouse=True, scope="module")
def usable() -> None:
    why = _why_no_slurm()
    if why is not None:
        pytest.skip(f"no usable Slurm here: {why}")
    ensure_image()


@pytest.fixture
def corral(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    run = cli_for(home, {k: v for k, v in ENV.items() if k != "SLURM_JOB_ID"}, cwd=tmp_path, timeout=60)
    run.env.pop("SLURM_JOB_ID", None)
    yield run
    for job in json.loads(run("queue", "--json").stdout or "[]"):  # its own jobs only: the lab is shared
        run("cancel", str(job["id"]))
    run.stop()


def _status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def _slurm_job_of(corral, job: str) -> str:
    """The Slurm job of the corral job, as its events name it (never by name in squeue: other
    homes' servers name theirs alike)."""
    for event in json.loads(corral("events", job, "--json", check=True).stdout):
        if (event["message"] or "").startswith("asked for as Slurm job "):
            return event["message"].split()[-1]
    raise AssertionError(f"no Slurm job asked for job {job}")


def _told(corral, job: str) -> str:
    return corral("events", job).stdout[-3000:] + corral("logs", job).stdout[-2000:]


def _mine(corral, job: str, task: str) -> list[str]:
    """The job's containers on this machine, of its home's scope (other runs share the engine)."""
    from corral.executors import scope_of
    from corral.settings import Settings

    prefix = f"corral-{scope_of(Settings(home=corral.home, db_url='sqlite://'))}-"
    return [n for n in containers_of() if n.startswith(prefix) and f"-{job}.{task}." in n]


def test_a_container_step_sees_its_step_s_environment_and_its_name_and_cancel_leaves_none(corral,
                                                                                         tmp_path: Path) -> None:
    spec = tmp_path / "boxed.yaml"
    spec.write_text(f"""
name: boxed
num_nodes: 2
resources: {{image_id: docker:{IMAGE}, accelerators: H100:2}}
readiness_probe: {{exec: "test -e {MARKER}", period: 1s}}  # run inside its container, where only the image has it
run: |
  test -e {MARKER} || exit 3
  echo "seen $CORRAL_REPLICA procid=$SLURM_PROCID job=$SLURM_JOB_ID step=$SLURM_STEP_ID gpus=$CUDA_VISIBLE_DEVICES host=$(hostname)"
  port=$((18431 + CORRAL_REPLICA)); httpd -p "$port" -h /www
  echo "resolved $CORRAL_REPLICA $(wget -q -O - "http://$CORRAL_HOSTNAME:$port/index.html")"
  exec sleep 300
""")
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    try:
        logs = wait_for(lambda: (out := corral("logs", job).stdout).count("resolved ") == 2 and out, timeout=90,
                        interval=0.5)
    except AssertionError:
        raise AssertionError(_told(corral, job)) from None
    slurm_id = _slurm_job_of(corral, job)
    replicas = {r["rank"]: r for t in _status(corral, job)["tasks"] for r in t["replicas"]}
    seen = {}
    for line in logs.splitlines():
        if "seen " in line:
            words = line.split("seen ", 1)[1].split()
            seen[int(words[0])] = dict(w.split("=", 1) for w in words[1:])
    assert sorted(seen) == [0, 1], logs
    for rank, inside in seen.items():
        assert inside["procid"] == str(rank), (rank, inside)  # the step's own, set when it started
        assert inside["job"] == slurm_id and inside["step"].isdigit(), inside
        # the step's GRES binding, passed in as Slurm set it (declared GPUs: no CDI devices here)
        gpus = inside["gpus"].split(",")
        assert len(gpus) == 2 and gpus == [str(g) for g in replicas[rank]["gpus"]], (inside, replicas[rank])
        assert inside["host"] == f"boxed-{rank}.boxed", inside
        assert f"resolved {rank} served from a container" in logs, logs
    assert len(_mine(corral, job, "boxed")) == 2
    wait_for(lambda: all(r["ready"] for t in _status(corral, job)["tasks"] for r in t["replicas"]), timeout=60,
             interval=0.5)
    corral("cancel", job, check=True)
    wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60, interval=0.5)
    wait_for(lambda: not _squeue_ids([slurm_id]), timeout=30, interval=0.5)
    wait_for(lambda: _mine(corral, job, "boxed") == [], timeout=30, interval=0.5)


def test_a_program_in_a_container_on_slurm_gets_the_stop_signal_and_its_grace(corral, tmp_path: Path) -> None:
    spec = tmp_path / "graced.yaml"
    spec.write_text(GRACED)
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: "up" in [x.split(" | ", 1)[-1] for x in corral("logs", job).stdout.splitlines()], timeout=90)
    assert corral("cancel", job).returncode == 0
    wait_for(lambda: _status(corral, job)["state"] in ("CANCELLED", "FAILED"), timeout=90)
    log = [line.split(" | ", 1)[-1] for line in corral("logs", job).stdout.splitlines()]
    assert "got TERM" in log and "saved" in log and "after" not in log, (log, _told(corral, job))

def test_a_container_of_an_allocation_slurm_ends_itself_is_removed(corral, tmp_path: Path) -> None:
    """An operator's scancel of the allocation: the step ends under Slurm, the engine's
    monitor (outside the step) would keep the container running; corral ends it."""
    import subprocess

    spec = tmp_path / "victim.yaml"
    spec.write_text(f"name: victim\nresources: {{image_id: docker:{IMAGE}}}\nrun: exec sleep 300\n")
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: _status(corral, job)["state"] == "RUNNING" and len(_mine(corral, job, "victim")) == 1, timeout=90,
             interval=0.5)
    slurm_id = _slurm_job_of(corral, job)
    subprocess.run(["scancel", slurm_id], env={**ENV}, check=True)
    wait_for(lambda: _status(corral, job)["state"] not in ("RUNNING", "STARTING"), timeout=90, interval=0.5)
    wait_for(lambda: _mine(corral, job, "victim") == [], timeout=30, interval=0.5)


def test_a_batch_script_s_pyxis_steps_run_in_containers_on_a_slurm_without_pyxis(corral, tmp_path: Path) -> None:
    """The lab's Slurm has no Pyxis: an srun line with Pyxis's options runs as a step of
    Slurm's own (its -N, --ntasks-per-node, --export, -l as written), each task in its
    container with its mounts, workdir and --container-env; a named container keeps what one
    step wrote for the next; no container is left when the job ends."""
    from container_lab import MARKER

    data = tmp_path / "data"
    data.mkdir()
    (data / "input.txt").write_text("from the node\n")
    out = tmp_path / "out"
    out.mkdir()
    registry, _, rest = IMAGE.partition("/")
    (tmp_path / "steps.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 2
export HF_HOME=/from/the/host PATH="$PATH"
srun -N 2 --ntasks-per-node=1 -l --export=ALL,STEP_VAR=given --container-image={registry}#{rest} \\
  --container-mounts={data}:/data:ro,{out}:/out --container-workdir=/out --container-env=HF_HOME \\
  sh -c 'cat /data/input.txt {MARKER} > seen.$SLURM_PROCID; touch /data/x 2>/dev/null || echo read-only >> seen.$SLURM_PROCID
         echo "$SLURMD_NODENAME $SLURM_STEP_ID $SLURM_JOB_ID $STEP_VAR $HF_HOME $(pwd)" >> seen.$SLURM_PROCID; echo done'
echo "step exit $?"
srun -N1 -n1 --container-image={IMAGE} --container-name=kept sh -c 'echo "written by step $SLURM_STEP_ID" > /kept'
srun -N1 -n1 --container-name=kept cat /kept
echo "batch $(srun -N1 -n1 hostname)"
srun -N1 -n1 --export=NONE --container-image={IMAGE} sh -c 'test -e {MARKER} && echo "inside with $HF_HOME."'
""")
    job = corral("sbatch", "--parsable", "-p", "gpu", "steps.sbatch", check=True).stdout.strip()
    try:
        wait_for(lambda: _status(corral, job)["state"] not in ("PENDING", "STARTING", "RUNNING"), timeout=120,
                 interval=0.5)
    except AssertionError:
        raise AssertionError(_told(corral, job)) from None
    log = corral("logs", job).stdout
    assert _status(corral, job)["state"] == "SUCCEEDED", _told(corral, job)
    slurm_id = _slurm_job_of(corral, job)
    assert "step exit 0" in log and "0: done" in log and "1: done" in log, log  # -l: Slurm's labels
    seen = [(out / f"seen.{rank}").read_text().splitlines() for rank in (0, 1)]
    for rank, lines in enumerate(seen):
        assert lines[:3] == ["from the node", "inside", "read-only"], seen
        node, step, slurm_job, var, hf_home, pwd = lines[3].split()
        assert slurm_job == slurm_id and var == "given" and hf_home == "/from/the/host" and pwd == "/out", lines
    assert seen[0][3].split()[0] != seen[1][3].split()[0], seen  # two nodes, one step of Slurm's
    assert seen[0][3].split()[1] == seen[1][3].split()[1], seen
    first = next(line.split("written by step ")[1] for line in log.splitlines() if "written by step " in line)
    assert first.isdigit(), log  # the second step read what the first (Slurm's step id) wrote
    assert "batch " in log  # a line without Pyxis's options is Slurm's srun as written
    assert "inside with ." in log, log  # --export=NONE: none of the script's variables, a container all the same
    assert not [n for n in containers_of("step") if n.startswith(f"corral-step-{job}.batch.")], containers_of("step")


@contextmanager
def _another_account(python_needed: bool):
    """A root server on the Slurm partition and a throwaway Unix account with a token of its
    own, a directory of its own and the test image in its own engine's store."""
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    from conformance.driver import Corral
    from conformance.harnesses import SlurmHarness
    from container_lab import SITE as CONTAINER_SITE, ensure_image_for, need_podman
    from unix_users import need_root, slurm_association, traversable_dir, unix_user

    need_root()
    podman = need_podman()
    with traversable_dir() as root, unix_user("cspx") as ann, slurm_association(ann.name, {**ENV}):
        def as_her(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", "--reuid", ann.name, "--regid", ann.name, "--init-groups", "--",
                                   "env", "-i", f"HOME={ann.home}", f"USER={ann.name}", "PATH=/usr/bin:/bin",
                                   *argv], capture_output=True, text=True, cwd="/")

        if python_needed and as_her(sys.executable, "-c", "import corral.node.slurmstep").returncode != 0:
            pytest.skip(f"another account may not run this Python ({sys.executable}, in root's home?): a batch "
                        "script's srun with Pyxis's options runs the server's Python as the job's account; run "
                        "the tests with a Python every account may run")
        image = ensure_image_for(ann.name)  # her own engine runs her containers, from her own store

        def her_containers() -> list[str]:
            done = as_her(podman, "ps", "-a", "--format", "{{.Names}}")
            assert done.returncode == 0, done.stderr
            return done.stdout.split()

        home = root / "home"
        home.mkdir()
        harness = SlurmHarness()
        (home / "config.yaml").write_text(harness.site() + CONTAINER_SITE)
        corral = Corral(home, harness)
        own = root / "ann"
        own.mkdir()
        os.chown(own, ann.uid, ann.gid)
        corral.start()
        with corral.as_account(ann.name, lambda: harness.cleanup(home)) as client:
            yield SimpleNamespace(corral=corral, client=client, ann=ann, own=own, image=image,
                                  containers=her_containers)


def test_another_account_s_pyxis_steps_on_slurm_run_as_it_and_leave_nothing_behind() -> None:
    """A root server, a batch script of another Unix account on the Slurm partition: its
    Pyxis steps' containers are that account's (its own rootless engine: its uid inside, the
    files it writes its own), its named container is kept for its next step and is its own,
    and when the job ends no container of its steps is left in its engine, nor its named
    container's files."""
    from conformance.harnesses import PARTITION
    from corral.spec.sbatch import load_batch

    with _another_account(python_needed=True) as her:
        own, ann = her.own, her.ann
        script = f"""#!/bin/bash
#SBATCH -N 2
echo "batch as $(id -u)"
srun -N 2 --ntasks-per-node=1 --container-image={her.image} --container-mounts={own}:/out --container-workdir=/out \\
  sh -c 'echo "task $SLURM_PROCID as $(id -u)"; touch made.$SLURM_PROCID'
srun -N 1 --container-image={her.image} --container-name=kept sh -c 'id -u > /kept'
srun -N 1 --container-name=kept sh -c 'echo "kept by $(cat /kept), read as $(id -u)"'
echo "named $CORRAL_NAMED_CONTAINERS"
"""
        batch = load_batch(script, source="boxed.sbatch", submit_dir=str(own))
        job = her.client.submit(batch.documents, source="boxed.sbatch", cwd=str(own),
                                scheduling={**batch.scheduling, "partition": PARTITION},
                                export=batch.export)["job"]["id"]
        done = her.corral.wait_job(job, timeout=120)
        log = her.corral.log(job)
        assert done["state"] == "SUCCEEDED", (done, log)
        uid = str(ann.uid)
        assert f"batch as {uid}" in log and f"task 0 as {uid}" in log and f"task 1 as {uid}" in log, log
        assert f"kept by {uid}, read as {uid}" in log, log  # step 1 wrote it in her container; step 2 read it
        assert all((own / f"made.{rank}").stat().st_uid == ann.uid for rank in (0, 1))
        named = Path(next(line for line in log.splitlines() if "named /" in line).split("named ", 1)[1])
        wait_for(lambda: not named.exists(), timeout=30, interval=0.5)  # the job's, gone with it
        assert not [n for n in her.containers() if n.startswith("corral-")], her.containers()


def test_another_account_s_image_id_replicas_on_slurm_see_their_slurm_variables() -> None:
    """Her rootless engine starts with nothing of the server's, but the step's own variables
    (SLURM_*, set by Slurm and corral only once the step runs) reach her container."""
    from conformance.harnesses import PARTITION

    with _another_account(python_needed=False) as her:
        job = her.client.submit(f"name: boxed\nnum_nodes: 2\nresources: {{image_id: docker:{her.image}}}\n"
                                "run: echo \"rank $SLURM_PROCID of $SLURM_NTASKS in $SLURM_JOB_ID as $(id -u)\"\n",
                                cwd=str(her.own), scheduling={"partition": PARTITION})["job"]["id"]
        done = her.corral.wait_job(job, timeout=120)
        log = her.corral.log(job)
        assert done["state"] == "SUCCEEDED", (done, log)
        for rank in (0, 1):
            line = next((x for x in log.splitlines() if f"rank {rank} of 2 in " in x), None)
            assert line is not None and line.split()[-1] == str(her.ann.uid), log
            assert line.split(" in ")[1].split()[0].isdigit(), log  # SLURM_JOB_ID, Slurm's
        assert not [n for n in her.containers() if n.startswith("corral-")], her.containers()


def test_cancel_ends_a_batch_script_s_pyxis_step_containers_on_slurm(corral, tmp_path: Path) -> None:
    (tmp_path / "long.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 2
srun -N 2 --ntasks-per-node=1 --container-image={IMAGE} --container-name=tf sleep 300
""")
    job = corral("sbatch", "--parsable", "-p", "gpu", "long.sbatch", check=True).stdout.strip()

    def steps() -> list[str]:
        return [n for n in containers_of("step") if n.startswith(f"corral-step-{job}.batch.")]

    try:
        wait_for(lambda: len(steps()) == 2, timeout=90, interval=0.5)
    except AssertionError:
        raise AssertionError(_told(corral, job)) from None
    slurm_id = _slurm_job_of(corral, job)
    corral("cancel", job, check=True)
    wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60, interval=0.5)
    wait_for(lambda: not _squeue_ids([slurm_id]), timeout=30, interval=0.5)
    wait_for(lambda: steps() == [], timeout=30, interval=0.5)


@pytest.fixture(scope="module")
def registry():
    registry = start_registry("private/slurmpull:1")
    yield registry
    registry.stop()


def test_a_step_pulling_its_image_is_starting_and_a_refused_pull_fails_once(corral, registry,
                                                                            tmp_path: Path) -> None:
    import shutil
    import time

    slow = tmp_path / "slow-podman"  # a node whose engine is slow to pull
    slow.write_text(f'#!/bin/sh\nif [ "$1" = pull ]; then sleep 5; fi\nexec {shutil.which("podman")} "$@"\n')
    slow.chmod(0o755)
    config = corral.home / "config.yaml"
    config.write_text(config.read_text().replace("containers:\n", f"containers:\n  engine: {slow}\n"))
    image = registry.image("private/slurmpull:1")
    login = (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}, "
             f"SKYPILOT_DOCKER_SERVER: {registry.address}}}\n")
    spec = tmp_path / "pulled.yaml"
    spec.write_text(f"name: pulled\nresources: {{image_id: docker:{image}}}\nrun: test -e {MARKER} && sleep 2\n" + login)
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: "corral: pulling" in corral("logs", job).stdout, timeout=90, interval=0.3)
    seen = set()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # the pull (5 s) is under way
        seen.add(_status(corral, job)["tasks"][0]["replicas"][0]["state"])
    assert seen == {"STARTING"}, seen
    done = wait_for(lambda: (s := _status(corral, job))["state"] in ("SUCCEEDED", "FAILED") and s, timeout=60,
                    interval=0.5)
    assert done["state"] == "SUCCEEDED", _told(corral, job)
    assert "in container" in corral("events", job).stdout, _told(corral, job)
    spec.write_text(f"name: refused\nresources: {{image_id: docker:{image}}}\nrun: echo never\n"
                    "restart: {policy: on_failure, max_restarts: 3, backoff: {initial: 0s}}\n")
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    done = wait_for(lambda: (s := _status(corral, job))["state"] in ("SUCCEEDED", "FAILED") and s, timeout=90,
                    interval=0.5)
    assert done["state"] == "FAILED" and "unauthorized" in (done["message"] or "").lower(), done
    assert done["tasks"][0]["replicas"][0]["restarts"] == 0, done


def _scope(corral) -> str:
    from corral.executors import scope_of
    from corral.settings import Settings

    return scope_of(Settings(home=corral.home, db_url="sqlite://"))


def test_a_container_on_slurm_has_its_node_s_name_and_its_attempt_s_mark(corral, tmp_path: Path) -> None:
    """``SLURMD_NODENAME`` (Slurm users' scripts read it) and ``CORRAL_ATTEMPT`` (which marks
    every process of an attempt, ``proctree.attempt_mark``) hold inside a replica's container
    on Slurm as outside it: a task with ``image_id``, a batch script's Pyxis step and a batch
    script run in its own container alike."""
    import subprocess

    scope = _scope(corral)
    spec = tmp_path / "marked.yaml"
    spec.write_text(f"name: marked\nresources: {{image_id: docker:{IMAGE}}}\n"
                    "run: echo \"inside node=$SLURMD_NODENAME attempt=$CORRAL_ATTEMPT key=$CORRAL_LAUNCH_KEY\"\n")
    job = corral("launch", "--slurm", "-d", str(spec), check=True).stdout.strip()
    done = wait_for(lambda: (s := _status(corral, job))["state"] in ("SUCCEEDED", "FAILED") and s, timeout=90,
                    interval=0.5)
    assert done["state"] == "SUCCEEDED", _told(corral, job)
    line = next((x for x in corral("logs", job).stdout.splitlines() if "inside node=" in x), "")
    said = dict(w.split("=", 1) for w in line.split("inside ", 1)[-1].split())
    slurm_nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=ENV).stdout
    assert said.get("node") in slurm_nodes.split(), (line, slurm_nodes)  # as Slurm names it, as outside
    assert said.get("attempt") == f"{said.get('key')}@{scope}" and said.get("key"), line
    (tmp_path / "marked.sbatch").write_text(f"""#!/bin/bash
#SBATCH -N 2
echo "outside attempt=$CORRAL_ATTEMPT"
srun -N 2 --ntasks-per-node=1 --container-image={IMAGE} sh -c 'echo "step node=$SLURMD_NODENAME attempt=$CORRAL_ATTEMPT"'
""")
    (tmp_path / "boxed.sbatch").write_text(f"""#!/bin/sh
#SBATCH --container-image={IMAGE}
echo "script node=$SLURMD_NODENAME attempt=$CORRAL_ATTEMPT key=$CORRAL_LAUNCH_KEY"
""")
    for script in ("marked.sbatch", "boxed.sbatch"):
        job = corral("sbatch", "--parsable", "-p", "gpu", script, check=True).stdout.strip()
        try:
            wait_for(lambda: _status(corral, job)["state"] not in ("PENDING", "STARTING", "RUNNING"), timeout=120,
                     interval=0.5)
        except AssertionError:
            raise AssertionError(_told(corral, job)) from None
        assert _status(corral, job)["state"] == "SUCCEEDED", _told(corral, job)
        log = [x.split(" | ", 1)[-1] for x in corral("logs", job).stdout.splitlines()]
        seen = [dict(w.split("=", 1) for w in x.split()[1:]) for x in log if x.startswith(("step ", "script "))]
        if script == "marked.sbatch":
            outside = next(x for x in log if x.startswith("outside ")).split("=", 1)[1]
            assert outside.endswith(f"@{scope}") and len(seen) == 2, log
            assert {s.get("attempt") for s in seen} == {outside}, log
            assert all(s.get("node") for s in seen) and seen[0]["node"] != seen[1]["node"], log
        else:
            assert len(seen) == 1 and seen[0].get("node"), log
            assert seen[0].get("attempt") == f"{seen[0].get('key')}@{scope}", log
