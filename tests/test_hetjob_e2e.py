"""A heterogeneous batch script (``#SBATCH hetjob``) run through the real ``corral`` command on
a real server with the local executor and three declared nodes with GPUs: a script shaped like
NeMo-Aligner's PPO launcher (a trainer on two nodes, a critic server on a third) sees Slurm's
per-component variables; ``srun --het-group=1`` runs on the critic's node, ``--het-group=0,1``
numbers ranks across both, ``srun A : B`` runs a command per component; ``corral status``
shows one job of component tasks, all placed at once on distinct nodes; a cancel ends all."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import cli_for, wait_for

DATA = Path(__file__).parent / "data" / "hetjob"
POOL = """
nodes:
  - {name: gpu, count: 3, gpus: 4, gpu_type: H100, cpus: 8, memory: 64}
"""


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    work = tmp_path_factory.mktemp("hetjob")
    home = work / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL)
    for item in DATA.iterdir():
        shutil.copy2(item, work / item.name)
    import corral as package
    root = str(Path(package.__file__).resolve().parents[1])
    pythonpath = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    run = cli_for(home, {"PYTHONPATH": pythonpath}, cwd=work)
    for name in [k for k in run.env if k.startswith("SLURM_")]:  # not inside an allocation of the test's own
        del run.env[name]
    yield run
    run.stop()


def status(corral, ident: str) -> dict:
    return json.loads(corral("status", ident, "--json", check=True).stdout)


def seen(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_nemo_shaped_hetjob_runs_each_component_on_its_own_nodes(corral) -> None:
    proc = corral("sbatch", "--wait", "rlhf_ppo.sbatch", timeout=120)
    job_id = proc.stdout.split()[3] if proc.stdout.startswith("Submitted") else ""
    assert proc.returncode == 0, (proc.stdout, proc.stderr, job_id and corral("logs", job_id).stdout)
    job = status(corral, job_id)
    assert job["name"] == "rlhf-ppo" and job["state"] == "SUCCEEDED"
    tasks = {t["name"]: t for t in job["tasks"]}
    assert sorted(tasks) == ["critic", "het0", "het0-node"]  # one job, its components' tasks
    replica = {name: t["replicas"][0] for name, t in tasks.items()}
    assert all(len(t["replicas"]) == 1 for t in tasks.values())
    batch_node, other_node, critic_node = (replica[n]["node"] for n in ("het0", "het0-node", "critic"))
    assert len({batch_node, other_node, critic_node}) == 3  # every component's node its own, as in Slurm
    assert len(replica["het0"]["gpus"]) == len(replica["het0-node"]["gpus"]) == 2
    assert len(replica["critic"]["gpus"]) == 1
    from corral.runtime.batchenv import hostlist

    group0 = hostlist([batch_node, other_node])
    out = corral.work / f"run-{job_id}"
    batch = dict(line.split("=", 1) for line in (out / "batch.env").read_text().splitlines())
    expected = {
        "SLURM_JOB_ID": job_id, "SLURM_HET_SIZE": "2", "SLURM_JOB_NAME": "rlhf-ppo",
        "SLURM_JOB_ID_HET_GROUP_0": job_id, "SLURM_JOB_ID_HET_GROUP_1": job_id,
        "SLURM_JOB_NODELIST": group0, "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURMD_NODENAME": batch_node,
        "SLURM_JOB_NODELIST_HET_GROUP_0": group0, "SLURM_JOB_NODELIST_HET_GROUP_1": critic_node,
        "SLURM_JOB_NUM_NODES_HET_GROUP_0": "2", "SLURM_JOB_NUM_NODES_HET_GROUP_1": "1",
        "SLURM_NTASKS_HET_GROUP_0": "2", "SLURM_NTASKS_HET_GROUP_1": "1",
        "SLURM_CPUS_PER_TASK_HET_GROUP_0": "2", "SLURM_CPUS_PER_TASK_HET_GROUP_1": "1",
        "SLURM_GPUS_PER_NODE_HET_GROUP_0": "2", "SLURM_GPUS_PER_NODE_HET_GROUP_1": "1",
        "SLURM_JOB_GPUS_HET_GROUP_0": ",".join(map(str, replica["het0"]["gpus"])),
        "SLURM_JOB_GPUS_HET_GROUP_1": ",".join(map(str, replica["critic"]["gpus"])),
        "SLURM_JOB_NAME_HET_GROUP_0": "rlhf-ppo", "SLURM_JOB_NAME_HET_GROUP_1": "critic",
        "SLURM_JOB_PARTITION_HET_GROUP_0": job["partition"], "SLURM_JOB_PARTITION_HET_GROUP_1": job["partition"],
    }
    assert {k: batch.get(k) for k in expected} == expected

    critic = seen(out / "critic-0.json")  # srun --het-group=1: the critic's node, GPU and layout
    assert critic["SLURMD_NODENAME"] == critic_node and critic["SLURM_JOB_NODELIST"] == critic_node
    assert critic["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, replica["critic"]["gpus"]))
    assert critic["SLURM_NTASKS"] == "1" and critic["SLURM_CPUS_PER_TASK"] == "1" and critic["SLURM_JOB_ID"] == job_id
    assert "SLURM_NTASKS_PER_NODE" not in critic  # component 0's own, not the critic's
    assert (out / f"critic-{job_id}-0.out").read_text().startswith(f"critic serving on {critic_node}")

    trainers = [seen(out / f"trainer-{rank}.json") for rank in (0, 1)]  # component 0, two nodes
    assert [t["SLURMD_NODENAME"] for t in trainers] == [batch_node, other_node]
    assert [t["CUDA_VISIBLE_DEVICES"] for t in trainers] == [",".join(map(str, replica[n]["gpus"]))
                                                             for n in ("het0", "het0-node")]
    assert all(t["SLURM_NTASKS"] == "2" and t["SLURM_JOB_NODELIST"] == group0 for t in trainers)
    log = corral("logs", job_id, check=True).stdout
    assert f"talks to the critic on {critic_node}" in log and "rlhf done" in log

    world = [seen(out / f"world-{rank}.json") for rank in range(3)]  # one step over both components
    assert [w["SLURMD_NODENAME"] for w in world] == [batch_node, other_node, critic_node]
    assert [w["SLURM_PROCID"] for w in world] == ["0", "1", "2"]
    assert all(w["SLURM_NTASKS"] == "3" and w["SLURM_HET_SIZE"] == "2" for w in world)
    assert all(w["SLURM_STEP_NODELIST_HET_GROUP_0"] == group0 for w in world)
    assert all(w["SLURM_STEP_NODELIST_HET_GROUP_1"] == critic_node for w in world)
    assert world[2]["SLURM_JOB_NODELIST"] == critic_node and world[0]["SLURM_JOB_NODELIST"] == group0
    assert world[2]["CUDA_VISIBLE_DEVICES"] == critic["CUDA_VISIBLE_DEVICES"]

    first, second = seen(out / "mpmd-trainer-0.json"), seen(out / "mpmd-critic-1.json")  # srun A : B
    assert first["SLURMD_NODENAME"] == batch_node and second["SLURMD_NODENAME"] == critic_node
    assert first["SLURM_NTASKS"] == second["SLURM_NTASKS"] == "2"
    assert not (out / "mpmd-critic-0.json").exists() and not (out / "mpmd-trainer-1.json").exists()


def test_a_command_line_hetjob_is_one_job_and_one_cancel_ends_every_component(corral) -> None:
    proc = corral("sbatch", "-N1", "-c", "1", ":", "-J", "side", "-N1", "-c", "1", "hold.sbatch", check=True)
    job_id = proc.stdout.split()[-1]

    def running() -> dict | None:
        job = status(corral, job_id)
        live = [r for t in job["tasks"] for r in t["replicas"] if r["state"] == "RUNNING"]
        return job if len(live) == 2 else None

    job = wait_for(running, timeout=60)
    assert sorted(t["name"] for t in job["tasks"]) == ["het0", "side"]
    queue = corral("queue", "--json", check=True).stdout
    assert sum(1 for j in json.loads(queue) if str(j["id"]) == job_id) == 1
    corral("cancel", job_id, check=True)
    job = wait_for(lambda: (j := status(corral, job_id))["state"] == "CANCELLED" and j, timeout=60)
    assert all(r["state"] not in ("RUNNING", "STARTING", "PENDING") for t in job["tasks"] for r in t["replicas"])


def test_a_component_whose_node_holder_dies_ends_the_whole_job_and_its_steps(corral) -> None:
    """The critic's step runs in the script's own process tree on the critic's node; when the
    replica holding that node dies (kill -9), its GPUs go back to the pool: the job must end
    there and then, its steps with it, as Slurm ends a job that loses a node."""
    import psutil

    script = corral.work / "lose.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N1 -c 1\n#SBATCH hetjob\n#SBATCH -J critic -N1 -c 1\n"
                      "srun --het-group=1 sleep 3071 &\nsrun --het-group=0 sleep 3071\n")
    job_id = corral("sbatch", "--parsable", "lose.sbatch", check=True).stdout.strip()

    def holder() -> dict | None:
        job = status(corral, job_id)
        tasks = {t["name"]: t["replicas"][0] for t in job["tasks"]}
        return tasks["critic"] if tasks["critic"]["state"] == "RUNNING" and tasks["het0"]["state"] == "RUNNING" \
            and tasks["critic"]["pid"] else None

    critic = wait_for(holder, timeout=60)
    steps = lambda: [p for p in psutil.process_iter(["cmdline"])  # noqa: E731
                     if p.info["cmdline"] == ["sleep", "3071"] and p.ppid() != critic["pid"]]
    wait_for(lambda: len(steps()) >= 2, timeout=30)
    for child in psutil.Process(critic["pid"]).children(recursive=True):
        child.kill()
    job = wait_for(lambda: (j := status(corral, job_id))["state"] in ("FAILED", "SUCCEEDED") and j, timeout=60)
    assert job["state"] == "FAILED" and "loses a node" in (job["message"] or ""), job
    assert "critic-0" in job["message"]
    wait_for(lambda: not steps(), timeout=30)  # the script's steps ended with it
