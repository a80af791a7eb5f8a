"""The sbatch corpus (tests/data/sbatch) run unchanged through the real ``corral`` command on a
real server with the local executor and three declared nodes with GPUs: Slurm's variables,
``srun`` steps with per-task environments, ``scontrol show hostnames``, an array with a
throttle, a dependency chain, ``--signal`` before the time limit, and a Ray head with workers
(a stand-in ``ray``). Also job arrays from YAML: folded in ``corral queue``, one element or all
cancelled."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import cli_for, wait_for

CORPUS = Path(__file__).parent / "data" / "sbatch"
POOL = """
nodes:
  - {name: gpu, count: 3, gpus: 4, gpu_type: H100, cpus: 8, memory: 64, labels: {ib: "yes", switch: leaf0}}
"""


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    work = tmp_path_factory.mktemp("sbatch")
    home = work / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL)
    for item in CORPUS.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, work / item.name)
    import corral as package  # the commands run from the work directory: import this corral there too
    root = str(Path(package.__file__).resolve().parents[1])
    pythonpath = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    # OMP_NUM_THREADS is passed to replicas from the server's machine, unless --export=NONE
    run = cli_for(home, {"OMP_NUM_THREADS": "3", "PYTHONPATH": pythonpath}, cwd=work)
    for name in [k for k in run.env if k.startswith("SLURM_")]:  # not inside an allocation of the test's own
        del run.env[name]
    yield run
    run.stop()


def job(corral, ident: str) -> dict:
    return json.loads(corral("status", ident, "--json", check=True).stdout)


def words(path: Path) -> dict[str, str]:
    return dict(w.split("=", 1) for w in path.read_text().split() if "=" in w)


def test_single_node_gpu_script_sees_slurm_variables_and_writes_its_output_file(corral) -> None:
    proc = corral("sbatch", "--wait", "single_gpu.sbatch", "a1", "b 2")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.split()[-1]
    assert proc.stdout.startswith("Submitted batch job")
    env = words(corral.work / "single.env")
    node = job(corral, job_id)["tasks"][0]["replicas"][0]
    assert env["job"] == job_id and env["name"] == "single-gpu" and env["nodes"] == node["node"]
    assert env["nnodes"] == "1" and env["ntasks"] == "1" and env["cpus"] == "2" and env["gpus_per_node"] == "2"
    assert env["cuda"] == ",".join(map(str, node["gpus"])) and len(node["gpus"]) == 2
    assert env["greeting"] == "hello" and env["procid"] == env["nodeid"] == env["restarts"] == "0"
    assert env["partition"] and env["account"]
    assert "args=a1 b 2" in (corral.work / "single.env").read_text() and env["omp"] == "3"
    output = (corral.work / f"single-gpu-{job_id}.out").read_text()
    assert f"done on {node['node']}" in output
    assert f"done on {node['node']}" in corral("logs", job_id, check=True).stdout  # the job's log too


def test_wrap_runs_its_command_as_a_script_named_wrap(corral) -> None:
    proc = corral("sbatch", "--wait", "-o", "wrap-%j.out", "--wrap", 'echo "wrapped $SLURM_JOB_NAME"; exit 3')
    job_id = proc.stdout.split()[-1]
    assert proc.returncode == 3 and proc.stdout.startswith("Submitted batch job"), (proc.stdout, proc.stderr)
    assert job(corral, job_id)["name"] == "wrap"
    assert (corral.work / f"wrap-{job_id}.out").read_text().strip() == "wrapped wrap"
    refused = corral("sbatch", "--wrap=true", "single_gpu.sbatch")
    assert refused.returncode == 2 and "--wrap" in refused.stderr


def test_slurm_s_name_for_a_job_is_the_script_s_file_name_or_j_as_written(corral) -> None:
    """sbatch's default job name is the script's file name (``train.sbatch``), and ``-J`` is
    kept as written; corral's own name (a host name) is the cleaned one."""
    script = corral.work / "named.sbatch"
    script.write_text('#!/bin/bash\n#SBATCH -o %x.out\necho "name=$SLURM_JOB_NAME"\n')
    assert corral("sbatch", "--wait", str(script)).returncode == 0
    assert (corral.work / "named.sbatch.out").read_text().strip() == "name=named.sbatch"
    done = corral("sbatch", "--wait", "--parsable", "-J", "my run", "-o", "%x-%j.out", str(script))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[-1]
    assert job(corral, job_id)["name"] == "my-run"
    assert (corral.work / f"my run-{job_id}.out").read_text().strip() == "name=my run"


def test_launch_detached_prints_a_script_s_job_id_as_it_does_a_yaml_s(corral) -> None:
    proc = corral("launch", "-d", "single_gpu.sbatch")
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), (proc.stdout, proc.stderr)  # JOB=$(corral launch -d …)
    assert job(corral, proc.stdout.strip())["name"] == "single-gpu"


def test_export_none_starts_the_script_with_slurm_variables_and_named_ones_only(corral) -> None:
    assert corral("launch", "export_none.sbatch").returncode == 0
    env = words(corral.work / "export.env")
    assert env["keep"] == "kept" and env["omp"] == "unset" and env["job"] != "unset" and env["home"] == "set"


def test_multi_node_srun_gives_each_task_its_rank_node_and_gpus(corral) -> None:
    proc = corral("launch", "multi_srun.sbatch")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = job(corral, "multi-srun")
    replicas = [r for t in data["tasks"] for r in t["replicas"]]
    nodes = [r["node"] for r in replicas]  # batch node first
    assert len(set(nodes)) == 2
    gpus = {r["node"]: r["gpus"] for r in replicas}
    lines = (corral.work / "multi.tasks").read_text().splitlines()
    assert len(lines) == 4
    for line in lines:
        label, rest = line.split(": ", 1)
        task = dict(w.split("=") for w in rest.split())
        rank = int(task["rank"])
        assert label == task["rank"] and task["local"] == str(rank % 2) and task["node"] == str(rank // 2)
        assert task["host"] == nodes[rank // 2] and task["step"] == "0" and task["ntasks"] == "4"
        assert task["gpus"] == str(gpus[task["host"]][rank % 2])  # one GPU per task, split from its node's
    last = (corral.work / "multi.last").read_text().splitlines()
    assert last[0].split()[1] == "1"  # the second step
    assert last[0].split()[0] in nodes and last[1] == "srun exit 4"  # the highest task exit code


def test_scontrol_show_hostnames_loop_on_nodes_with_a_feature(corral) -> None:
    assert corral("launch", "hostnames.sbatch").returncode == 0
    lines = (corral.work / "hostnames.out").read_text().splitlines()
    data = job(corral, "hostnames")
    placed = [r["node"] for t in data["tasks"] for r in t["replicas"]]
    assert [line.split()[1] for line in lines] == placed and len(set(placed)) == 3
    shown = (corral.work / "hostnames.job").read_text()
    assert f"JobId={data['id']}" in shown and "NumNodes=3" in shown and "JobState=RUNNING" in shown
    assert (corral.work / f"hostnames-{data['id']}.err").read_text() == f"to stderr from {placed[0]}\n"
    assert (corral.work / f"hostnames-{data['id']}.out").read_text() == "to stdout\n"


def test_a_node_s_hostname_is_its_name_in_the_nodelist_and_resolves(corral) -> None:
    """As on a Slurm node: ``hostname`` is a name of ``SLURM_JOB_NODELIST``, so the usual head
    test (``[ "$(hostname)" = "$head" ]``) and ``MASTER_ADDR=$head`` work, on every node."""
    script = corral.work / "heads.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH -J heads\n"
                      'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")\n'
                      'head=$(echo "$nodes" | head -n1); other=$(echo "$nodes" | tail -n1)\n'
                      '[ "$(hostname)" = "$head" ] && echo "head is me"\n'
                      'getent hosts "$head" | cut -f1 -d" "\n'
                      'getent hosts "$other" | cut -f1 -d" "\n'
                      'srun -N1 -n1 -w "$other" hostname\n')
    proc = corral("launch", str(script))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    data = job(corral, "heads")
    replicas = {r["node"]: r for t in data["tasks"] for r in t["replicas"]}
    said = [line.split("| ", 1)[1].strip() for line in proc.stdout.splitlines() if "| " in line]
    head, other = list(replicas)  # the batch node first
    assert said == ["head is me", replicas[head]["addr"], replicas[other]["addr"], other], (said, replicas)


def test_array_with_throttle_runs_every_element_at_most_two_at_once(corral) -> None:
    proc = corral("sbatch", "array.sbatch")
    assert proc.returncode == 0 and "(array of 6)" in proc.stdout, proc.stderr
    array_id = proc.stdout.split()[3]
    queued = corral("queue", check=True).stdout
    assert f"{array_id}_" in queued
    after = corral("sbatch", "--parsable", "-J", "after-sweep", "-d", f"afterok:{array_id}", "chain_second.sbatch",
                   check=True).stdout.strip()  # on the whole array: every element
    wait_for(lambda: job(corral, after)["state"] == "SUCCEEDED", timeout=30)
    assert job(corral, after)["dependency"].count(":") == 6
    runs = []
    for i in range(6):
        parent, index, own, start, end = (corral.work / f"sweep.{i}").read_text().split()
        assert parent == array_id and index == str(i)
        assert (corral.work / f"sweep-{array_id}_{i}.log").exists()
        runs.append((float(start), float(end)))
    most = max(sum(1 for s, e in runs if s <= t < e) for t, _ in runs)
    assert most <= 2
    elements = json.loads(corral("queue", "--all", "--json", check=True).stdout)
    mine = [j for j in elements if j["array_job_id"] == int(array_id)]
    assert sorted(j["array_index"] for j in mine) == list(range(6)) and mine[0]["id"] == int(array_id)


def test_dependency_chain_waits_then_runs_or_never_can(corral) -> None:
    first = corral("sbatch", "--parsable", "chain_first.sbatch", check=True).stdout.strip()
    second = corral("sbatch", "--parsable", f"--dependency=afterok:{first}", "chain_second.sbatch",
                    check=True).stdout.strip()
    assert job(corral, second)["reason"] in ("Dependency", None)
    wait_for(lambda: job(corral, second)["state"] == "SUCCEEDED", timeout=20)
    assert (corral.work / "chain.log").read_text().split() == ["first", "second"]
    assert job(corral, first)["ended_at"] <= job(corral, second)["started_at"]
    failing = corral("sbatch", "--parsable", "-J", "chain-bad", "chain_first.sbatch", "3", check=True).stdout.strip()
    stays = corral("sbatch", "--parsable", "-J", "chain-stays", "-d", f"afterok:{failing}", "chain_second.sbatch",
                   check=True).stdout.strip()
    dies = corral("sbatch", "--parsable", "-J", "chain-dies", f"--dependency=afterok:{failing}",
                  "--kill-on-invalid-dep=yes", "chain_second.sbatch", check=True).stdout.strip()
    wait_for(lambda: job(corral, stays)["reason"] == "DependencyNeverSatisfied", timeout=20)
    assert job(corral, stays)["state"] == "PENDING"
    assert "DependencyNeverSatisfied" in corral("queue", check=True).stdout
    wait_for(lambda: job(corral, dies)["state"] == "CANCELLED", timeout=10)
    corral("cancel", stays, check=True)


def test_signal_reaches_the_batch_shell_before_the_time_limit_and_not_its_steps(corral) -> None:
    began = time.time()
    proc = corral("launch", "signal.sbatch")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    started = int(proc.stdout.split("started at ")[1].split()[0])
    warned = int((corral.work / "signal.out").read_text().split()[-1])
    assert 0 <= warned - started <= 4 and time.time() - began < 8  # 8 s limit, warned 6 s before it
    assert not (corral.work / "signal.step").exists()  # B: the batch shell only


def test_ray_head_and_workers_script_runs_as_written(corral) -> None:
    proc = corral("launch", "ray_cluster.sbatch")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Starting WORKER 2" in proc.stdout and "driver done" in proc.stdout
    data = job(corral, "ray-cluster")
    placed = {r["node"]: r["gpus"] for t in data["tasks"] for r in t["replicas"]}
    joined = (corral.work / "ray.status").read_text().splitlines()
    assert len(joined) == 3
    for line in joined:
        node, gpus = line.split(" gpus=")
        assert gpus == ",".join(map(str, placed[node]))
    assert set(line.split()[0] for line in joined) == set(placed)
    assert data["state"] == "SUCCEEDED"  # the head and workers, still up, ended with the script


def test_a_requeued_script_runs_again_with_its_restart_count(corral) -> None:
    job_id = corral("sbatch", "--parsable", "requeue.sbatch", check=True).stdout.strip()
    runs = corral.work / "requeue.runs"
    wait_for(lambda: runs.exists() and runs.read_text() == "run 0\n", timeout=15)
    corral("requeue", job_id, check=True)
    wait_for(lambda: job(corral, job_id)["state"] == "SUCCEEDED", timeout=30)
    assert runs.read_text() == "run 0\nrun 1\n" and job(corral, job_id)["requeues"] == 1


def test_yaml_array_is_folded_in_the_queue_and_cancelled_by_element_or_whole(corral) -> None:
    spec = corral.work / "sweep.yaml"
    spec.write_text("name: yaml-sweep\nrun: echo $SLURM_ARRAY_TASK_ID\n")
    array_id = corral("launch", "-d", "-H", "--array", "0-15%4", str(spec), check=True).stdout.strip()
    queue = corral("queue", check=True).stdout
    assert f"{array_id}_[0-15%4]" in queue and "JobHeldUser" in queue
    assert "cancelling" in corral("cancel", f"{array_id}_3", check=True).stdout
    wait_for(lambda: job(corral, f"{array_id}_3")["state"] == "CANCELLED", timeout=10)
    element = job(corral, f"{array_id}_4")
    assert element["state"] == "PENDING" and element["array_job_id"] == int(array_id) and element["array_index"] == 4
    whole = corral("cancel", array_id, check=True).stdout
    assert "cancelling (15 array elements)" in whole, whole  # 16 elements, one cancelled already
    wait_for(lambda: all(j["state"] == "CANCELLED" for j in
                         json.loads(corral("queue", "--all", "--json", check=True).stdout)
                         if j["array_job_id"] == int(array_id)), timeout=10)
    assert corral("launch", "--array", "9-1", str(spec)).returncode == 2


def test_an_array_s_id_holds_releases_and_requeues_the_whole_array(corral) -> None:
    """As ``scontrol hold|release|requeue ARRAYID``: every element it applies to, the running
    ones left alone by hold; ``ARRAYID_INDEX`` one element, named so in what is said."""
    spec = corral.work / "holds.yaml"
    spec.write_text("name: holds\nresources: {accelerators: H100:4}\nrun: |\n  trap 'exit 0' TERM\n"
                    "  while true; do sleep 0.1; done\n")
    array_id = corral("launch", "-d", "--array", "0-4", str(spec), check=True).stdout.strip()
    elements = lambda: {j["array_index"]: j for j in json.loads(corral("queue", "--all", "--json", check=True).stdout)  # noqa: E731
                        if j["array_job_id"] == int(array_id)}
    wait_for(lambda: sum(j["state"] == "RUNNING" for j in elements().values()) == 3, timeout=30)  # 3 nodes x 4 GPUs
    held = corral("hold", array_id)
    assert held.returncode == 0 and f"Array {array_id}: 2 of 5 element(s) held" in held.stdout, held
    assert all(j["hold"] for j in elements().values() if j["state"] == "PENDING")
    one = corral("release", f"{array_id}_4", check=True).stdout
    assert f"Job {array_id}_4 released" in one, one
    rest = corral("release", array_id, check=True).stdout
    assert f"Array {array_id}: 1 of 5 element(s) released" in rest, rest
    requeued = corral("requeue", array_id, check=True).stdout
    assert f"Array {array_id}: 3 of 5 element(s) requeueing" in requeued, requeued
    assert corral("cancel", array_id).returncode == 0
    wait_for(lambda: all(j["state"] == "CANCELLED" for j in elements().values()), timeout=30)
    again = corral("hold", array_id)
    assert again.returncode == 1 and "no element is pending" in again.stderr, again


def test_bad_script_is_refused_with_its_line_and_nothing_is_submitted(corral) -> None:
    bad = corral.work / "bad.sbatch"
    bad.write_text("#!/bin/bash\n#SBATCH -J bad-script\n#SBATCH --nodes=two\n#SBATCH --mail-user=x\necho\n")
    before = corral("queue", "--all", "--json", check=True).stdout
    proc = corral("launch", str(bad))
    assert proc.returncode == 2 and "line 3" in proc.stderr and "--nodes" in proc.stderr
    assert corral("queue", "--all", "--json", check=True).stdout == before
    proc = corral("sbatch", "--frobnicate", str(bad))
    assert proc.returncode == 2 and "--frobnicate" in proc.stderr
    plain = corral.work / "plain.yaml"
    plain.write_text("name: plain\nrun: 'true'\n")
    proc = corral("sbatch", str(plain))
    assert proc.returncode == 2 and "does not look like a batch script" in proc.stderr
    assert corral("queue", "--all", "--json", check=True).stdout == before


@pytest.fixture
def site_config() -> str:  # for the in-process ``server``: a partition that preempts, one that requeues
    return POOL + """
partitions:
  - {name: batch, nodes: ["gpu-*"], preempt_mode: requeue}
  - {name: urgent, nodes: ["gpu-*"], priority_tier: 10}
"""


def test_no_requeue_cancels_a_preempted_job_where_the_partition_would_requeue_it(server) -> None:
    from conftest import submit, wait_state

    low = submit(server, "name: low\nrequeue: false\nnum_nodes: 3\nresources: {accelerators: H100:4}\n"
                         "grace_period: 1s\nrun: sleep 60\n")
    wait_state(server, low["id"], "RUNNING")
    high = submit(server, "name: high\nresources: {accelerators: H100:4}\nrun: 'true'\n",
                  scheduling={"partition": "urgent"})
    wait_state(server, high["id"], "SUCCEEDED")
    ended = wait_state(server, low["id"], "CANCELLED")
    assert ended["requeues"] == 0 and "--no-requeue" in ended["message"]
