"""A job on a Slurm partition behaves as the same job does on this machine and as Slurm users
expect, on the slurm-lab (Slurm 22.05, ``SLURM_CONF`` from the environment or
/tmp/slurmlab/slurm.env): ranks, the submitter's umask, one story for job ids, auxiliaries that
end cleanly, a time limit that ends the job TIMEOUT. Skipped, with the reason, where no Slurm
answers. Only this module's own Slurm jobs are ever cancelled (the lab is shared)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import cli_for, wait_for
from slurm_env import slurm_env

SITE = """
nodes:
  - {name: node, count: 2, gpus: 4, gpu_type: H100, cpus: 8, memory: 32}
partitions:
  - {name: here, infra: local}
  - {name: gpu, infra: slurm, slurm_partition: gpu}
"""


ENV = slurm_env(keep_job_variables=False)


def _slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, env=ENV, timeout=30).stdout


@pytest.fixture(autouse=True, scope="module")
def usable_slurm() -> None:
    done = subprocess.run(["sinfo", "-h", "-o", "%D %G"], capture_output=True, text=True, env=ENV, timeout=30) \
        if subprocess.run(["which", "sinfo"], capture_output=True).returncode == 0 else None
    if done is None or done.returncode != 0:
        pytest.skip(f"no usable Slurm here: {done.stderr.strip() if done else 'sinfo is not installed'}")


def _prefix(home: Path) -> str:
    from corral.executors import scope_of
    from corral.settings import Settings

    return f"corral-{scope_of(Settings(home=home, db_url='sqlite://'))}-"


def _cancel_ours(home: Path) -> None:
    prefix = _prefix(home)
    ours = [line.split()[0] for line in _slurm("squeue", "-h", "-o", "%i %j").splitlines()
            if len(line.split()) == 2 and line.split()[1].startswith(prefix)]
    if ours:
        _slurm("scancel", *ours)


@pytest.fixture
def corral(tmp_path: Path):
    """``corral`` commands on a home with a local and a Slurm partition, its server started
    with umask 027 (the submitter's here, to tell it from the server's private 077 and the
    usual 022)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    work = tmp_path / "work"  # the filesystem the lab's nodes share with us
    work.mkdir()
    run = cli_for(home, ENV, cwd=work, timeout=120, umask=0o027)
    run.work = work
    yield run
    run.stop()
    _cancel_ours(home)


def _status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def _wait(corral, job: str, timeout: float = 180) -> dict:
    return wait_for(lambda: (lambda s: s if s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")
                             else None)(_status(corral, job)), timeout=timeout, interval=0.5)


def _slurm_id(corral, job: str) -> str:
    """The Slurm job that held corral job ``job`` (from accounting: it may have ended)."""
    name = f"{_prefix(corral.home)}{job}"

    def recorded():  # accounting may lag a moment behind the controller
        ids = [line.split("|")[0] for line in _slurm("sacct", "-n", "-P", "-X", "-S", "now-1hour", "--name", name,
                                                     "-o", "JobID").splitlines() if line]
        assert len(ids) <= 1, (name, ids)
        return ids[0] if ids else None

    return wait_for(recorded, timeout=30, interval=0.5)


def _steps(slurm_id: str) -> dict[str, tuple[str, str]]:
    """Accounting of a Slurm job's steps: name -> (state, exit code), once all are final."""
    def final():
        rows = [line.split("|") for line in _slurm("sacct", "-n", "-P", "-j", slurm_id, "-o",
                                                   "JobID,JobName,State,ExitCode").splitlines() if line]
        if not rows or any(r[2] in ("RUNNING", "PENDING", "COMPLETING") for r in rows):
            return None
        return {r[1]: (r[2].split()[0], r[3]) for r in rows}

    return wait_for(final, timeout=60, interval=0.5)


RANKS = """
num_nodes: 2
resources: {accelerators: H100:1}
run: |
  echo "ranks procid=$SLURM_PROCID ntasks=$SLURM_NTASKS nnodes=$SLURM_NNODES nodeid=$SLURM_NODEID \\
  localid=$SLURM_LOCALID tasks_per_node=$SLURM_TASKS_PER_NODE step_tasks=$SLURM_STEP_NUM_TASKS \\
  umask=$(umask)"
  touch made-$SLURM_JOB_NAME-$SLURM_PROCID
"""


def _ranks(corral, partition: str) -> dict[str, dict[str, str]]:
    (corral.work / "ranks.yaml").write_text(RANKS)
    job = corral("launch", "-d", "-p", partition, "--name", f"ranks-{partition}", "ranks.yaml",
                 check=True).stdout.strip()
    done = _wait(corral, job)
    assert done["state"] == "SUCCEEDED", (done["state"], done.get("message"), done.get("tasks"))
    lines = [line.split(" | ", 1)[-1] for line in corral("logs", job, check=True).stdout.splitlines()
             if "ranks procid=" in line]
    seen = {}
    for line in lines:
        values = dict(part.split("=", 1) for part in line.split()[1:])
        seen[values["procid"]] = values
    return seen


def test_ranks_on_slurm_are_what_the_same_file_gives_locally(corral) -> None:
    local, slurm = _ranks(corral, "here"), _ranks(corral, "gpu")
    assert sorted(slurm) == sorted(local) == ["0", "1"], (local, slurm)
    for rank in ("0", "1"):
        assert slurm[rank]["ntasks"] == local[rank]["ntasks"] == slurm[rank]["step_tasks"] == "2", (local, slurm)
        # where the two replicas land may differ; what the variables say of it is Slurm's rule
        for seen in (local[rank], slurm[rank]):
            same = seen["nnodes"] == "1"
            assert seen["nodeid"] == ("0" if same else rank)
            assert seen["localid"] == (rank if same else "0")
            assert seen["tasks_per_node"] == ("2" if same else "1(x2)")


def test_replicas_on_slurm_create_files_with_the_submitters_umask(corral) -> None:
    seen = _ranks(corral, "gpu")
    assert {v["umask"] for v in seen.values()} == {"0027"}, seen  # not the server's private 0077
    for rank in ("0", "1"):
        assert os.stat(corral.work / f"made-ranks-gpu-{rank}").st_mode & 0o777 == 0o640


GROUP = """
name: svc
execution: parallel
primary_tasks: [main]
---
name: main
run: sleep 2; echo main done
---
name: aux
grace_period: 20s
run: |
  trap 'echo "aux got TERM"; exit 0' TERM
  echo aux up
  while :; do sleep 0.2; done
"""


def test_auxiliaries_of_a_succeeded_job_end_cleanly_in_slurm_too(corral) -> None:
    (corral.work / "svc.yaml").write_text(GROUP)
    job = corral("launch", "-d", "-p", "gpu", "svc.yaml", check=True).stdout.strip()
    done = _wait(corral, job)
    assert done["state"] == "SUCCEEDED", (done["state"], done.get("message"), done.get("tasks"))
    aux = corral("logs", job, "aux-0", check=True).stdout
    assert "aux got TERM" in aux, aux  # the stop signal, with its grace, not a kill
    assert "slurmstepd" not in aux and "CANCELLED" not in aux, aux
    steps = _steps(_slurm_id(corral, job))
    ours = {name: fate for name, fate in steps.items() if ".aux." in name or ".main." in name}
    assert len(ours) == 2 and all(state == "COMPLETED" for state, _ in ours.values()), steps
    assert not [name for name, (state, _) in steps.items() if state == "CANCELLED"], steps


ARRAY = """#!/bin/bash
#SBATCH -o out-%j.log
#SBATCH -e err-%A_%a.log
echo "job=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID index=$SLURM_ARRAY_TASK_ID count=$SLURM_ARRAY_TASK_COUNT"
"""


def test_a_scripts_job_id_is_its_allocations_and_names_its_files(corral) -> None:
    (corral.work / "ids.sbatch").write_text(ARRAY)
    array = corral("sbatch", "--parsable", "-p", "gpu", "--array", "0-1", "ids.sbatch", check=True).stdout.strip()
    outs = wait_for(lambda: (lambda found: found if len(found) == 2 and all(f.read_text() for f in found) else None)(
        list(corral.work.glob("out-*.log"))), timeout=180, interval=0.5)
    members = {j["array_index"]: str(j["id"]) for j in json.loads(corral("queue", "--all", "--json").stdout)
               if j.get("array_job_id") == int(array)}
    for out in outs:
        seen = dict(part.split("=", 1) for part in out.read_text().split())
        # SLURM_JOB_ID is the allocation's, as srun and scontrol in the script know it; so is %j
        assert seen["job"] == _slurm_id(corral, members[int(seen["index"])]), seen
        assert out.name == f"out-{seen['job']}.log"
        assert (seen["array"], seen["count"]) == (array, "2")
        assert (corral.work / f"err-{array}_{seen['index']}.log").exists()


def test_a_time_limit_ends_a_batch_job_timeout(corral) -> None:
    (corral.work / "slow.sbatch").write_text("#!/bin/bash\n#SBATCH -t 0:05\necho start\nsrun sleep 300\n")
    job = corral("sbatch", "--parsable", "-p", "gpu", "slow.sbatch", check=True).stdout.strip()
    done = _wait(corral, job, timeout=120)
    assert done["state"] == "TIMEOUT", done


def _allocation_state(slurm_id: str) -> str:
    """The Slurm job's own state in accounting, once final."""
    def final():
        state = _slurm("sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State").strip().split()
        return state[0] if state and state[0] not in ("RUNNING", "PENDING", "COMPLETING") else None

    return wait_for(final, timeout=60, interval=0.5)


def test_slurm_s_accounting_ends_each_job_as_corral_does(corral) -> None:
    """sacct agrees with corral: a job that succeeded COMPLETED, one that failed FAILED, one
    cancelled CANCELLED (not every job COMPLETED because its holder exited 0)."""
    ends = {}
    for name, run in (("ok", "echo ok"), ("bad", "exit 3"), ("stopped", "exec sleep 300")):
        (corral.work / f"{name}.yaml").write_text(f"name: acct-{name}\nrun: {run}\n")
        ends[name] = corral("launch", "-d", "-p", "gpu", f"{name}.yaml", check=True).stdout.strip()
    wait_for(lambda: _status(corral, ends["stopped"])["state"] == "RUNNING", timeout=120, interval=0.5)
    corral("cancel", ends["stopped"], check=True)
    seen = {name: _wait(corral, job)["state"] for name, job in ends.items()}
    assert seen == {"ok": "SUCCEEDED", "bad": "FAILED", "stopped": "CANCELLED"}, seen
    slurm = {name: _allocation_state(_slurm_id(corral, job)) for name, job in ends.items()}
    assert slurm == {"ok": "COMPLETED", "bad": "FAILED", "stopped": "CANCELLED"}, slurm


def test_gpus_slurm_binds_past_the_first_ones_are_shown_and_nothing_stalls(corral) -> None:
    """Slurm binds a step the host's GPU indices (4, 5 … when others hold 0-3), while the
    node of an allocation counts its GPUs from 0: the replica shows Slurm's, and the
    scheduler keeps placing the next jobs."""
    nodes = _slurm("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N").split()
    holders = [_slurm("sbatch", "--parsable", "-p", "gpu", "--gres=gpu:4", f"--nodelist={node}", "--job-name",
                      f"{_prefix(corral.home)}busy", "--wrap", "sleep 300").strip() for node in sorted(set(nodes))]
    try:
        (corral.work / "one.yaml").write_text("resources: {accelerators: H100:1}\n"
                                              "run: echo bound=$CUDA_VISIBLE_DEVICES; sleep 6\n")
        first = corral("launch", "-d", "-p", "gpu", "--name", "bound0", "one.yaml", check=True).stdout.strip()
        wait_for(lambda: _status(corral, first)["state"] == "RUNNING", timeout=120, interval=0.5)
        # placed while the first holds the host's GPU 4 or later: the scheduler reads it without a fault
        second = corral("launch", "-d", "-p", "gpu", "--name", "bound1", "one.yaml", check=True).stdout.strip()
        wait_for(lambda: _status(corral, second)["state"] in ("RUNNING", "SUCCEEDED"), timeout=60, interval=0.5)
        told = corral("events", first, check=True).stdout + corral("events", second, check=True).stdout
        assert "a lost database write" not in told, told  # no cycle failed over the first's GPUs
        for job in (first, second):
            done = _wait(corral, job)
            assert done["state"] == "SUCCEEDED", (done["state"], done.get("message"))
            shown = done["tasks"][0]["replicas"][0]["gpus"]
            log = corral("logs", job, check=True).stdout
            assert f"bound={shown[0]}" in log and shown[0] >= 4, (shown, log)
    finally:
        _slurm("scancel", *[h for h in holders if h])


def test_replicas_of_one_port_where_the_lab_s_nodes_share_an_address_are_refused_with_a_sentence(corral) -> None:
    # the lab's nodes are loopback addresses of one machine: one port space for them all, so
    # two replicas listening on port 8000 could never both start; refused at once, never held
    (corral.work / "port.yaml").write_text("name: port2\nnum_nodes: 2\nports: {http: 8000}\n"
                                           "run: python3 -m http.server 8000\n")
    out = corral("launch", "-d", "-p", "gpu", "port.yaml")
    assert out.returncode != 0, out.stdout
    assert "2 replicas declare port 8000" in out.stderr and "address" in out.stderr, out.stderr
    assert corral("queue", "--json", check=True).stdout.strip() in ("[]", "")
