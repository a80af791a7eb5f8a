"""Slurm's variables mean the same on every infra, through a real server: a task is one step
and each replica one task of it (``SLURM_PROCID`` its rank, ``SLURM_NTASKS`` the replicas, node
ids, local ids and node lists that agree with where the replicas run), an array element sees
sbatch's array variables, a batch script's ``%j`` is the ``SLURM_JOB_ID`` it sees, files are
created with the user's umask, and a missing ``--output`` directory fails the job with a
sentence and is never created (docs/sbatch.md, "Slurm's variables on every infra")."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hostlist import expand_hostlist

from conformance.driver import Corral, wait_for
from conformance.harnesses import PARTITION, describe


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().split("\0") if "=" in line)


def _counts(text: str) -> list[int]:
    """Slurm's ``2(x3),1`` form, expanded."""
    out: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        assert match, text
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


def test_a_replicas_rank_variables_describe_its_task_as_one_slurm_step(corral: Corral, harness, work: Path) -> None:
    # 3 replicas of 2 GPUs on nodes of 4 (local, Ray): two share a node, one is alone
    job = corral.launch("ranks", f"""
num_nodes: 3
resources: {{accelerators: {harness.gpu_type}:2}}
run: |
  env -0 > {work}/env-$CORRAL_REPLICA.part && mv {work}/env-$CORRAL_REPLICA.part {work}/env-$CORRAL_REPLICA
  umask > {work}/umask-$CORRAL_REPLICA
  touch {work}/file-$CORRAL_REPLICA
""")
    done = corral.wait_job(job, timeout=120)
    assert done["state"] == "SUCCEEDED", describe(done)
    reps = corral.replicas(job)
    nodes = [reps[f"ranks-{rank}"]["node"] for rank in range(3)]
    order = list(dict.fromkeys(nodes))
    seen = {rank: _env_file(work / f"env-{rank}") for rank in range(3)}
    for rank, env in seen.items():
        where = f"ranks-{rank} on {nodes[rank]}: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())
                                                               if k.startswith("SLURM"))
        assert env["SLURM_PROCID"] == str(rank), where
        assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == env["SLURM_STEP_NUM_TASKS"] == "3", where
        assert env["SLURM_NNODES"] == env["SLURM_STEP_NUM_NODES"] == str(len(order)), where
        assert env["SLURM_NODEID"] == str(order.index(nodes[rank])), where
        assert env["SLURM_LOCALID"] == str(nodes[:rank].count(nodes[rank])), where
        listed = expand_hostlist(env["SLURM_NODELIST"])
        assert env["SLURM_STEP_NODELIST"] == env["SLURM_NODELIST"] and len(listed) == len(order), where
        # the node list, the node id and the node's own name agree, whatever the infra names it
        assert listed[int(env["SLURM_NODEID"])] == env["SLURMD_NODENAME"], where
        assert _counts(env["SLURM_TASKS_PER_NODE"]) == [nodes.count(n) for n in order], where
        assert env["SLURM_STEP_TASKS_PER_NODE"] == env["SLURM_TASKS_PER_NODE"], where
        job_nodes = expand_hostlist(env["SLURM_JOB_NODELIST"])
        assert env["SLURM_JOB_NUM_NODES"] == str(len(job_nodes)) and set(listed) <= set(job_nodes), where
        assert env["SLURM_JOB_ID"] and env["CORRAL_JOB_ID"] == str(job), where
        assert env["SLURM_JOB_NAME"] == "ranks", where
        # files are created with the user's umask (022 here), never the server's private one
        assert (work / f"umask-{rank}").read_text().strip() == "0022", where
        assert (os.stat(work / f"file-{rank}").st_mode & 0o777) == 0o644
    assert len({env["SLURM_JOB_ID"] for env in seen.values()}) == 1, "one job id for every replica"


def test_an_array_element_sees_sbatchs_array_variables(corral: Corral, work: Path) -> None:
    path = corral.specs / "sweep.yaml"
    path.write_text(f"run: env -0 > {work}/env-$SLURM_ARRAY_TASK_ID\n")
    first = int(corral("launch", "-d", "-p", PARTITION, "--name", "sweep", "--array", "1-5:2", str(path))
                .stdout.strip().split()[0])

    def ended() -> list[dict] | None:
        members = list(corral.client().iter_jobs(all=True, array=first))
        finished = [j for j in members if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")]
        return finished if len(finished) == 3 else None

    elements = wait_for(ended, timeout=180, interval=0.5, what="the array's 3 elements ended")
    assert {j["state"] for j in elements} == {"SUCCEEDED"}, elements
    ids = {j["array_index"]: j["id"] for j in elements}
    for index in (1, 3, 5):
        env = _env_file(work / f"env-{index}")
        assert env["SLURM_ARRAY_JOB_ID"] == str(first) and env["SLURM_ARRAY_TASK_ID"] == str(index), env
        assert (env["SLURM_ARRAY_TASK_COUNT"], env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"],
                env["SLURM_ARRAY_TASK_STEP"]) == ("3", "1", "5", "2"), env
        assert env["CORRAL_JOB_ID"] == str(ids[index])


def test_a_batch_scripts_files_carry_the_job_ids_it_sees(corral: Corral, work: Path) -> None:
    script = corral.specs / "named.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH -o {work}/out-%j.log
#SBATCH -e {work}/err-%A_%a.log
echo "job=$SLURM_JOB_ID array=$SLURM_ARRAY_JOB_ID index=$SLURM_ARRAY_TASK_ID"
echo "umask=$(umask)" >&2
""")
    array = corral("sbatch", "--parsable", "-p", PARTITION, "--array", "0-1", str(script)).stdout.strip()
    wait_for(lambda: len(list(work.glob("out-*.log"))) == 2 and all(
        f.read_text().strip() for f in work.glob("out-*.log")) and len(list(work.glob("err-*.log"))) == 2 and all(
        f.read_text().strip() for f in work.glob("err-*.log")), timeout=180, interval=0.5, what="both elements' files")
    for out in work.glob("out-*.log"):
        seen = dict(part.split("=", 1) for part in out.read_text().split())
        assert out.name == f"out-{seen['job']}.log", (out.name, seen)  # %j is the SLURM_JOB_ID it sees
        assert seen["array"] == array
        err = work / f"err-{seen['array']}_{seen['index']}.log"  # %A_%a are its array variables
        assert err.read_text().strip() == "umask=0022"


def test_a_missing_output_directory_fails_the_job_and_is_not_created(corral: Corral, work: Path) -> None:
    script = corral.specs / "lost.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -o {work}/nowhere/out-%j.log\necho never\n")
    job = int(corral("sbatch", "--parsable", "-p", PARTITION, str(script)).stdout.strip())
    done = corral.wait_job(job, timeout=120)
    assert done["state"] == "FAILED", describe(done)
    assert not (work / "nowhere").exists()
    log = corral.log(job)
    assert f"directory {work}/nowhere does not exist" in log and "never" not in log, log
    # and the job's own message says so, not an exit code alone
    assert f"directory {work}/nowhere does not exist" in (done.get("message") or ""), describe(done)
