"""Heterogeneous batch scripts (``#SBATCH hetjob``) read into corral job groups
(``corral.spec.hetjob``), and the steps corral's ``srun`` plans over their components
(``corral.node.srun.plan``): pure, no processes."""

from __future__ import annotations

import json

import pytest
import yaml

from corral.node.srun import UsageError, het_groups, plan
from corral.runtime import batchenv
from corral.spec.batchstep import BatchStep
from corral.spec.loader import SpecError, load_job
from corral.spec.sbatch import command_line_components, load_batch, parse_command_line

NEMO = """#!/bin/bash
#SBATCH -J ppo -N 2 --ntasks-per-node=2 --gpus-per-node=4 -c 2 --mem=8G -t 30 -p batch -A rl
#SBATCH -o ppo-%j.out
#SBATCH {separator}
#SBATCH -J critic -N 1 -n 1 --gres=gpu:1 -c 3 --mem=2G --constraint=ib -t 30 -p batch
srun --het-group=1 python serve_critic.py &
srun --het-group=0 python train.py
"""


def tasks_of(batch) -> dict[str, dict]:
    return {d["name"]: d for d in batch.documents[1:]}


@pytest.mark.parametrize("separator", ["hetjob", "packjob"])
def test_each_component_becomes_tasks_of_one_gang_scheduled_group(separator: str) -> None:
    batch = load_batch(NEMO.format(separator=separator), source="ppo.sbatch")
    header = batch.documents[0]
    assert header == {"name": "ppo", "execution": "parallel", "primary_tasks": ["het0"], "termination_delay": 0}
    tasks = tasks_of(batch)
    assert list(tasks) == ["het0", "het0-node", "critic"]
    assert tasks["het0"]["sbatch"]["role"] == "batch" and "num_nodes" not in tasks["het0"]
    assert tasks["het0-node"]["num_nodes"] == 1 and tasks["critic"]["num_nodes"] == 1
    assert tasks["het0"]["resources"] == {"cpus": 4, "memory": 8.0, "accelerators": 4}
    assert tasks["critic"]["resources"] == {"cpus": 3, "memory": 2.0, "accelerators": 1}
    assert tasks["critic"]["constraint"] == "ib" and "constraint" not in tasks["het0"]
    assert all(t["distinct_nodes"] for t in tasks.values())
    assert [t["sbatch"]["het_group"] for t in tasks.values()] == [0, 0, 1]
    assert batch.scheduling == {"partition": "batch", "account": "rl", "time_limit": 1800.0}
    het = tasks["het0"]["sbatch"]["het"]
    assert [(g["name"], g["tasks"], g["nodes"], g["ntasks"], g["cpus_per_task"], g["gpus_per_node"], g["job_name"])
            for g in het] == [("het0", ["het0", "het0-node"], 2, 4, 2, 4, "ppo"), ("critic", ["critic"], 1, 1, 3, 1,
                                                                                   "critic")]
    spec = load_job(yaml.safe_dump_all(batch.documents)).spec  # what the server validates
    assert [t.name for t in spec.tasks] == ["het0", "het0-node", "critic"]
    assert spec.tasks[0].sbatch.het[1].name == "critic" and spec.tasks[2].sbatch.het_group == 1


def test_a_one_node_first_component_has_no_holder_and_unnamed_components_are_numbered() -> None:
    text = ("#!/bin/sh\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -N2\n#SBATCH hetjob\n#SBATCH -N1 -J three\n"
            "#SBATCH hetjob\n#SBATCH -J reward.v2\n#SBATCH hetjob\n#SBATCH -J reward-v2\necho\n")
    batch = load_batch(text, source="three.sh")
    # the job's own name and a name taken already are no component's: those are numbered
    assert [(d["name"], d.get("num_nodes")) for d in batch.documents[1:]] == [
        ("het0", None), ("het1", 2), ("het2", 1), ("reward-v2", 1), ("het4", 1)]
    assert batch.documents[0]["name"] == "three"


def test_the_command_line_gives_components_with_colons_and_overrides_the_scripts_by_position() -> None:
    components, rest, issues, _ = command_line_components(["-N2", ":", "-J", "reward", "-c", "4", "run.sh", "a"])
    assert not issues and rest == ["run.sh", "a"] and len(components) == 2
    batch = load_batch("#!/bin/sh\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -c 2\necho\n", source="run.sh",
                       overrides=components)
    tasks = tasks_of(batch)
    assert list(tasks) == ["het0", "het0-node", "reward"]
    assert tasks["reward"]["resources"]["cpus"] == 4
    # two components on the command line make a plain script heterogeneous
    batch = load_batch("#!/bin/sh\n#SBATCH -N1\necho\n", source="run.sh", overrides=components)
    assert list(tasks_of(batch)) == ["het0", "het0-node", "reward"]
    _, _, issues, _ = parse_command_line(["-N1", ":", "-N1", "x.sh"])  # corral launch takes one component
    assert [i.field for i in issues] == [":"]


@pytest.mark.parametrize("line, field, words", [
    ("#SBATCH --array=0-3", "--array", "cannot be a job array"),
    ("#SBATCH -p other", "--partition", "differs from the first component's (line 2)"),
    ("#SBATCH --dependency=afterok:1", "--dependency", "give it in the first component"),
    ("#SBATCH --container-image=ubuntu", "--container-image", "give it in the first component"),
])
def test_a_whole_job_option_in_a_later_component_is_refused_naming_its_line(line: str, field: str,
                                                                            words: str) -> None:
    text = f"#!/bin/sh\n#SBATCH -N1 -p batch\n#SBATCH hetjob\n#SBATCH -N1\n{line}\necho\n"
    with pytest.raises(SpecError) as caught:
        load_batch(text, source="bad.sh")
    (issue,) = caught.value.issues
    assert issue.line == 5 and issue.field == field and words in issue.message


def test_an_array_of_a_hetjob_is_refused_in_the_first_component_too_and_a_hetjob_line_stands_alone() -> None:
    with pytest.raises(SpecError) as caught:
        load_batch("#!/bin/sh\n#SBATCH --array=1-2\n#SBATCH hetjob -N2\n#SBATCH -N1\necho\n", source="bad.sh")
    assert sorted((i.line, i.field) for i in caught.value.issues) == [(2, "--array"), (3, "hetjob")]


def test_same_job_wide_values_in_every_component_are_accepted_as_scripts_repeat_them() -> None:
    batch = load_batch(NEMO.format(separator="hetjob"), source="ppo.sbatch")  # -t 30 -p batch twice
    assert batch.scheduling["time_limit"] == 1800.0


# -- the steps corral's srun plans -----------------------------------------------------------


def _env() -> dict[str, str]:
    batch = load_batch(NEMO.format(separator="hetjob"), source="ppo.sbatch")
    step = BatchStep(**batch.documents[1]["sbatch"])
    nodes = (batchenv.NodeSlot("n1", (0, 1, 2, 3), 4, "10.0.0.1", "het0"),
             batchenv.NodeSlot("n3", (7,), 3, "10.0.0.3", "critic"),
             batchenv.NodeSlot("n2", (4, 5, 6, 7), 4, "10.0.0.2", "het0-node"))
    ctx = batchenv.BatchContext(42, "ppo", "ann", "batch", "rl", "normal", 1800.0, 0, None, None, nodes, "/w")
    return batchenv.batch_env(step, ctx, None)


def test_the_script_sees_component_0_and_every_component_suffixed() -> None:
    env = _env()
    assert env["SLURM_JOB_NODELIST"] == "n[1-2]" and env["SLURM_NTASKS"] == "4" and env["SLURM_HET_SIZE"] == "2"
    assert env["SLURM_JOB_NODELIST_HET_GROUP_1"] == "n3" and env["SLURM_JOB_GPUS_HET_GROUP_1"] == "7"
    assert env["SLURM_JOB_CPUS_PER_NODE_HET_GROUP_1"] == "3" and env["SLURM_TASKS_PER_NODE_HET_GROUP_0"] == "2(x2)"
    assert env["SLURM_JOB_ID_HET_GROUP_0"] == env["SLURM_JOB_ID_HET_GROUP_1"] == "42"
    assert "SLURM_NTASKS_PER_NODE_HET_GROUP_1" not in env and env["SLURM_NTASKS_PER_NODE_HET_GROUP_0"] == "2"
    assert [n["group"] for n in json.loads(env["CORRAL_SBATCH_NODES"])] == [0, 0, 1]


def test_srun_runs_on_component_0_by_default_and_on_the_named_one_with_het_group() -> None:
    env = _env()
    default = plan(["hostname"], env)
    assert [(t["node"], t["rank"], t["group"]) for t in default] == [("n1", 0, 0), ("n1", 1, 0), ("n2", 2, 0),
                                                                     ("n2", 3, 0)]
    critic = plan(["--het-group=1", "serve"], env)
    assert [(t["node"], t["gpus"], t["rank"]) for t in critic] == [("n3", [7], 0)]
    assert critic[0]["base"]["SLURM_JOB_NODELIST"] == "n3" and critic[0]["base"]["SLURM_CPUS_PER_TASK"] == "3"
    assert "SLURM_NTASKS_PER_NODE" not in critic[0]["base"]


def test_a_step_over_several_components_numbers_ranks_across_them() -> None:
    env = _env()
    for expr in ("0,1", "0-1"):
        tasks = plan([f"--het-group={expr}", "-l", "train"], env)
        assert [(t["rank"], t["node"], t["node_index"], t["group"]) for t in tasks] == [
            (0, "n1", 0, 0), (1, "n1", 0, 0), (2, "n2", 1, 0), (3, "n2", 1, 0), (4, "n3", 2, 1)]
    mpmd = plan(["-n1", "a", "x", ":", "b", "y"], env)
    assert [(t["rank"], t["node"], t["command"]) for t in mpmd] == [(0, "n1", ["a", "x"]), (1, "n3", ["b", "y"])]
    shared = plan(["-n1", ":", "-n1", "hostname"], env)  # a component without a command runs the next one's
    assert [t["command"] for t in shared] == [["hostname"], ["hostname"]]


@pytest.mark.parametrize("argv, words", [
    (["--het-group=2", "x"], "components 0-1, not 2"),
    (["--het-group=a", "x"], "is not a list of components"),
    (["a", ":", "b", ":", "c"], "3 components"),
])
def test_srun_names_what_is_wrong_with_a_het_step(argv: list[str], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        plan(argv, _env())


def test_het_group_is_refused_in_a_job_that_is_not_heterogeneous() -> None:
    env = {"CORRAL_SBATCH_NODES": json.dumps([{"name": "n1", "gpus": [], "cpus": 1}]), "SLURM_NTASKS": "1"}
    with pytest.raises(UsageError, match="heterogeneous job"):
        plan(["--het-group=0", "x"], env)
    with pytest.raises(UsageError, match="not heterogeneous"):
        plan(["a", ":", "b"], env)
    assert het_groups("1,3-4", 5) == [1, 3, 4]


def test_srun_output_patterns_name_a_file_per_task_or_one_for_all() -> None:
    from corral.node.srun import _het_step_env, _output_path

    env = {**_env(), "SLURM_JOB_USER": "ann"}
    tasks = plan(["--het-group=0,1", "x"], env)
    paths = [_output_path("out/%x-%j.%s-%t-%N-%3n-%u%%.log", t, 5, env, "/w") for t in tasks]
    assert paths[0] == "/w/out/ppo-42.5-0-n1-000-ann%.log" and paths[4] == "/w/out/ppo-42.5-4-n3-002-ann%.log"
    assert {_output_path("/abs/%J.log", t, 5, env, "/w") for t in tasks} == {"/abs/42.5.log"}
    assert _het_step_env(tasks) == {
        "SLURM_HET_SIZE": "2",
        "SLURM_STEP_NODELIST_HET_GROUP_0": "n[1-2]", "SLURM_STEP_NUM_NODES_HET_GROUP_0": "2",
        "SLURM_STEP_NUM_TASKS_HET_GROUP_0": "4", "SLURM_STEP_TASKS_PER_NODE_HET_GROUP_0": "2(x2)",
        "SLURM_STEP_NODELIST_HET_GROUP_1": "n3", "SLURM_STEP_NUM_NODES_HET_GROUP_1": "1",
        "SLURM_STEP_NUM_TASKS_HET_GROUP_1": "1", "SLURM_STEP_TASKS_PER_NODE_HET_GROUP_1": "1"}
