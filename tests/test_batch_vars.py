"""Slurm's variables as corral computes them, without processes: a task is one step and each
replica one task of it (ranks, node ids, local ids, node lists, tasks per node), an array's
extent, sbatch's file patterns whose %j is the engine's id, and the layout a Slurm step gets
over its own variables (``corral.runtime.batchenv``, ``corral.executors.slurm.executor``)."""

from __future__ import annotations

from hostlist import expand_hostlist

from corral.executors.slurm.layout import step_layout
from corral.runtime.batchenv import (BatchContext, NodeSlot, array_extent, expand_pattern, fill_job_id, rename_nodes,
                                     task_layout)
from corral.runtime.environment import ReplicaContext, replica_env
from corral.spec.jobarray import parse_array


def test_two_replicas_of_a_task_are_two_ranks_of_one_step() -> None:
    env = [task_layout(rank, ("gpu-0", "gpu-1"), ("gpu-0", "gpu-1")) for rank in range(2)]
    assert [e["SLURM_PROCID"] for e in env] == ["0", "1"]
    assert {e["SLURM_NTASKS"] for e in env} == {"2"} == {e["SLURM_STEP_NUM_TASKS"] for e in env}
    assert [e["SLURM_NODEID"] for e in env] == ["0", "1"]
    assert [e["SLURM_LOCALID"] for e in env] == ["0", "0"]
    assert env[0]["SLURM_NODELIST"] == env[0]["SLURM_STEP_NODELIST"] == "gpu-[0-1]"
    assert env[0]["SLURM_NNODES"] == env[0]["SLURM_JOB_NUM_NODES"] == "2"
    assert env[0]["SLURM_TASKS_PER_NODE"] == "1(x2)" and env[0]["SLURM_NTASKS_PER_NODE"] == "1"


def test_replicas_sharing_a_node_are_numbered_as_slurm_numbers_tasks_of_a_node() -> None:
    # ranks 0 and 2 on b, 1 on a (as a cyclic distribution would place them)
    nodes = ("b", "a", "b")
    env = [task_layout(rank, nodes, ("a", "b", "c")) for rank in range(3)]
    assert [e["SLURM_NODEID"] for e in env] == ["0", "1", "0"]  # the task's nodes in order of first rank
    assert [e["SLURM_LOCALID"] for e in env] == ["0", "0", "1"]
    assert env[0]["SLURM_NODELIST"] == "b,a" and env[0]["SLURM_NNODES"] == "2"
    assert env[0]["SLURM_TASKS_PER_NODE"] == "2,1" and "SLURM_NTASKS_PER_NODE" not in env[0]
    # the job's nodes are every node of the job, sorted as Slurm lists an allocation
    assert expand_hostlist(env[0]["SLURM_JOB_NODELIST"]) == ["a", "b", "c"]
    assert env[0]["SLURM_JOB_NUM_NODES"] == "3"


def test_a_replica_not_yet_placed_counts_as_a_task_without_a_node() -> None:
    env = task_layout(0, ("n1", ""), ("n1",))
    assert env["SLURM_NTASKS"] == "2" and env["SLURM_NNODES"] == "1" and env["SLURM_NODEID"] == "0"


def test_replica_env_carries_the_layout_and_no_longer_numbers_nodes_by_rank() -> None:
    ctx = ReplicaContext(job_id=7, job_name="j", is_group=False, task="t", rank=1, num_replicas=2, node="n0",
                         node_ips=("10.0.0.1", "10.0.0.1"), addr="10.0.0.1", gpus=(1,), gpus_per_replica=1, cpus=1,
                         master_port=1, checkpoint_dir="/c", restart_count=0, user="u",
                         task_nodes=("n0", "n0"), job_nodes=("n0",), array_job_id=5, array_index=4,
                         array_extent=(3, 0, 4, 2))
    env = replica_env({}, ctx)
    assert (env["SLURM_PROCID"], env["SLURM_NODEID"], env["SLURM_LOCALID"], env["SLURM_NNODES"]) == ("1", "0", "1", "1")
    assert env["SLURMD_NODENAME"] == "n0" and env["SLURM_JOB_NODELIST"] == "n0"
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("5", "4")
    assert (env["SLURM_ARRAY_TASK_COUNT"], env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"],
            env["SLURM_ARRAY_TASK_STEP"]) == ("3", "0", "4", "2")


def test_an_arrays_extent_is_slurms() -> None:
    # as sbatch on the slurm-lab gave them: 0-6:3, 1,3,7, 5, 2-8:2, 1-3,10
    cases = {"0-6:3": (3, 0, 6, 3), "1,3,7": (3, 1, 7, 1), "5": (1, 5, 5, 1), "2-8:2%1": (4, 2, 8, 2),
             "1-3,10": (4, 1, 10, 1)}
    for text, extent in cases.items():
        assert parse_array(text).extent == extent, text
    assert array_extent((3, 0, 6, 3)) == {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0",
                                          "SLURM_ARRAY_TASK_MAX": "6", "SLURM_ARRAY_TASK_STEP": "3"}
    assert array_extent(None) == {}


def _ctx(**changes) -> BatchContext:
    base = dict(job_id=12, job_name="sweep%x", user="alice", partition="p", account="a", qos="q", time_limit=None,
                restart_count=0, array_job_id=10, array_index=2, nodes=(NodeSlot("n0", (), 1, "10.0.0.1"),),
                workdir="/w%d")
    base.update(changes)
    return BatchContext(**base)


def test_file_patterns_leave_the_job_id_to_the_engine_where_it_is_the_engines() -> None:
    ctx = _ctx()
    pattern = "out/%x-%A_%3a-%j-%J-%5j-100%%.log"
    full = expand_pattern(pattern, ctx, "n0")
    assert full == "/w%d/out/sweep%x-10_002-12-12.batch-00012-100%.log"
    residual = expand_pattern(pattern, ctx, "n0", job_id=False)
    assert fill_job_id(residual, "12") == full  # the same file where the engine's id is corral's
    assert fill_job_id(residual, "4711") == "/w%d/out/sweep%x-10_002-4711-4711.batch-04711-100%.log"


def test_node_lists_are_renamed_to_the_machines_an_infra_knows() -> None:
    env = task_layout(1, ("s9-gpu002", "s9-gpu001"), ("s9-gpu001", "s9-gpu002"))
    rename_nodes(env, lambda n: n.split("-", 1)[1])
    assert env["SLURM_NODELIST"] == env["SLURM_STEP_NODELIST"] == "gpu002,gpu001"  # order of the ranks kept
    assert env["SLURM_JOB_NODELIST"] == "gpu[001-002]"


def test_a_slurm_step_gets_the_layout_on_its_command_line_and_srun_gets_no_slurm_variable() -> None:
    env = {"PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "s9-gpu001",
           "SLURM_ARRAY_TASK_ID": "3", "SLURM_RESTART_COUNT": "1",
           **task_layout(0, ("s9-gpu001", "s9-gpu001"), ("s9-gpu001",))}
    argv = step_layout(env, lambda n: n.split("-", 1)[1])
    assert not [k for k in env if k.startswith("SLURM")], env  # the srun client reads these as options
    assert argv[0] == "env"
    given = dict(a.split("=", 1) for a in argv[1:])
    assert given["SLURM_NTASKS"] == "2" and given["SLURM_NODELIST"] == "gpu001"
    assert given["SLURM_ARRAY_TASK_ID"] == "3" and given["SLURM_RESTART_COUNT"] == "1"
    # who the job is stays Slurm's: its id and the GPUs its GRES bound
    assert "SLURM_JOB_ID" not in given and "SLURM_JOB_GPUS" not in given and "SLURMD_NODENAME" not in given
