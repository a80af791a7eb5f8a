"""Slurm batch scripts, the pure parts: reading directives and command-line options into
corral's job model (every directive, overrides, warnings, errors with their line), job
array syntax, output patterns, Slurm's environment, srun's task layout, and the scheduler
honouring node constraints, distinct nodes and array throttles."""

from __future__ import annotations

import pytest
from builders import node, snapshot, task

from corral.runtime import batchenv as slurmjob
from corral.node.scontrol import scontrol
from corral.node.srun import UsageError, parse_args, plan_step
from corral.scheduler import PendingJob, Policy, RunningJob, schedule
from corral.scheduler.plan import Allocation, Reason
from corral.scheduler.placement import why_infeasible
from corral.spec import load_job
from corral.spec.batchstep import BatchStep
from corral.spec.jobarray import fold, parse_array
from corral.spec.loader import SpecError
from corral.spec.sbatch import is_batch_script, load_batch, parse_command_line, slurm_minutes, slurm_size_gb


def script(*directives: str, body: str = "echo hi\n") -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + body


def batch(*directives: str, cli: list[str] | None = None, **kw):
    given = None
    if cli is not None:
        given, rest, issues, warnings = parse_command_line(cli + ["x.sbatch"])
        assert not issues and rest == ["x.sbatch"]
        kw.setdefault("warnings", warnings)
    return load_batch(script(*directives), source="x.sbatch", submit_dir="/work", overrides=given, **kw)


def spec_of(job):
    """The job as corral's loader reads it (what the server stores)."""
    import yaml

    return load_job(yaml.safe_dump_all(job.documents), scheduling=job.scheduling).spec


def step(job, task: int = 0) -> dict:
    docs = job.documents[1:] if len(job.documents) > 1 else job.documents
    return docs[task]["sbatch"]


# -- detection ------------------------------------------------------------------------------

def test_a_batch_script_needs_a_shebang_and_directives_before_the_first_command() -> None:
    assert is_batch_script("#!/bin/bash\n# comment\n\n#SBATCH -N 1\necho\n")
    assert not is_batch_script("#SBATCH -N 1\necho\n")  # no #! line
    assert not is_batch_script("#!/bin/bash\necho hi\n#SBATCH -N 1\n")  # after a command: a comment
    assert not is_batch_script("name: hello\nrun: echo\n")


def test_directives_after_the_first_command_are_not_read() -> None:
    job = load_batch("#!/bin/bash\n#SBATCH -J early\necho\n#SBATCH -J late\n", source="x.sbatch")
    assert spec_of(job).name == "early"


# -- every directive ------------------------------------------------------------------------

def test_one_node_job_with_gpus_cpus_memory_and_time() -> None:
    job = batch("--job-name=train", "-c 4", "--gres=gpu:a100:2", "--mem=16G", "-t 1-02:30:00",
                "--partition=batch", "-A ml", "--qos=high")
    spec = spec_of(job)
    assert spec.name == "train" and not spec.group and len(spec.tasks) == 1
    res = spec.tasks[0].resources
    assert (res.gpu_type, res.gpus, res.cpus, res.memory) == ("a100", 2, 4, 16.0)
    assert spec.time_limit == 86400 + 2 * 3600 + 30 * 60
    assert (spec.scheduling.partition, spec.scheduling.account, spec.scheduling.qos) == ("batch", "ml", "high")
    assert spec.tasks[0].workdir == "/work" and step(job)["submit_dir"] == "/work"


def test_multi_node_job_is_a_batch_task_and_node_holders_on_distinct_nodes() -> None:
    job = batch("-N 3", "--ntasks-per-node=4", "--gpus-per-task=2", "--cpus-per-task=2", "--mem-per-cpu=1G")
    spec = spec_of(job)
    assert spec.group and [t.name for t in spec.tasks] == ["batch", "node"]
    assert spec.primary_tasks == ("batch",) and spec.termination_delay == {"batch": 0.0, "node": 0.0}
    batch_task, holders = spec.tasks
    assert holders.num_nodes == 2 and batch_task.num_nodes == 1
    assert batch_task.distinct_nodes and holders.distinct_nodes
    for t in spec.tasks:  # one node's share: 4 tasks x 2 GPUs, 4 x 2 CPUs, 8 CPUs x 1 GB
        assert (t.resources.gpus, t.resources.cpus, t.resources.memory) == (8, 8, 8.0)
    assert batch_task.sbatch.role == "batch" and holders.sbatch.role == "node"
    assert (batch_task.sbatch.ntasks, batch_task.sbatch.gpus_per_task, batch_task.sbatch.nodes) == (12, 2, 3)


@pytest.mark.parametrize("directive, gpus, gpu_type", [
    ("--gres=gpu:4", 4, None), ("--gres=gpu:h100:4", 4, "h100"), ("--gres=gpu", 1, None),
    ("--gpus-per-node=h100:2", 2, "h100"), ("-G 6", 3, None), ("--gpus=a100:4", 2, "a100")])
def test_every_way_to_ask_for_gpus(directive: str, gpus: int, gpu_type: str | None) -> None:
    nodes = 2 if directive.startswith(("-G", "--gpus=")) else 1
    t = spec_of(batch(directive, f"--nodes={nodes}")).tasks[0]
    assert (t.resources.gpus, t.resources.gpu_type) == (gpus, gpu_type)


def test_ntasks_spread_over_nodes_and_cpus_follow() -> None:
    job = batch("--ntasks=5", "--nodes=2", "-c 3")
    assert step(job)["ntasks"] == 5
    assert spec_of(job).tasks[0].resources.cpus == 9  # ceil(5/2) = 3 tasks x 3 CPUs on the fullest node
    assert slurmjob.tasks_per_node(BatchStep(role="batch", nodes=2, ntasks=5)) == [3, 2]
    assert slurmjob.compressed_counts([2, 2, 2, 1]) == "2(x3),1"


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("5:30", 330), ("1:02:03", 3723), ("2-0", 172800),
                                           ("1-2:30", 95400), ("1-02:03:04", 93784), ("0:08", 8)])
def test_every_slurm_time_format(text: str, seconds: float) -> None:
    assert slurm_minutes(text) == seconds


def test_unlimited_time_and_sizes() -> None:
    assert slurm_minutes("UNLIMITED") is None and slurm_minutes("infinite") is None
    assert slurm_size_gb("2048") == 2.0 and slurm_size_gb("1T") == 1024 and slurm_size_gb("512M") == 0.5
    assert "time_limit" not in batch("-t UNLIMITED").scheduling


def test_signal_requeue_constraint_nodelist_chdir_exclusive_dependency_and_hold() -> None:
    job = batch("--signal=B:USR1@90", "--no-requeue", "--constraint=ib&switch=leaf0", "--nodelist=gpu-[0-1]",
                "-D sub", "--exclusive", "--dependency=afterok:12:13,singleton", "-H", "--nice=5",
                "--kill-on-invalid-dep=yes")
    spec = spec_of(job)
    t = spec.tasks[0]
    assert (t.signal_before_timeout.signal, t.signal_before_timeout.seconds) == ("SIGUSR1", 90)
    assert t.sbatch.signal_batch_only and t.sbatch.warn_signal == "SIGUSR1"
    assert t.constraint == "ib&switch=leaf0" and t.nodelist == ("gpu-0", "gpu-1") and t.exclusive
    assert t.workdir == "/work/sub"
    sched = spec.scheduling
    assert sched.requeue is False and sched.hold and sched.nice == 5 and sched.kill_on_invalid_dep
    assert sched.dependency == (("afterok", (12, 13)), ("singleton", ()))
    assert spec_of(batch("--nodelist=gpu-[0-1]")).tasks[0].sbatch.nodes == 2  # -w alone sets the node count
    assert not spec_of(batch("--signal=USR2")).tasks[0].sbatch.signal_batch_only
    assert spec_of(batch("--signal=12@30")).tasks[0].signal_before_timeout.signal == "SIGUSR2"


def test_after_dependency_and_requeue_flag_last_wins() -> None:
    assert spec_of(batch("-d after:4:5")).scheduling.dependency == (("after", (4, 5)),)
    assert spec_of(batch("--no-requeue", "--requeue")).scheduling.requeue is True


def test_export_values_names_and_none() -> None:
    job = batch("--export=ALL,A=1,HOMEDIR", environ={"HOMEDIR": "/h"})
    assert job.documents[0]["envs"] == {"A": "1", "HOMEDIR": "/h"}
    assert step(batch("--export=NONE"))["export_none"] is True
    with pytest.raises(SpecError, match="MISSING is not set"):
        batch("--export=MISSING", environ={})


def test_array_and_output_patterns() -> None:
    job = batch("--array=1,3,5-9:2%3", "-o logs/%x-%A_%a.out", "-e err-%j-%4a.txt")
    assert job.array == "1,3,5,7,9%3"
    s = BatchStep(**step(job))
    ctx = slurmjob.BatchContext(41, "x", "alice", "p", "a", "q", None, 0, 40, 7,
                                (slurmjob.NodeSlot("gpu-3", (0,), 1, ""),), "/w")
    assert slurmjob.expand_pattern(s.output, ctx, "gpu-3") == "/w/logs/x-40_7.out"
    assert slurmjob.expand_pattern(s.error, ctx, "gpu-3") == "/w/err-41-0007.txt"
    assert slurmjob.expand_pattern("/abs/%N-%u-%%-%J.log", ctx, "gpu-3") == "/abs/gpu-3-alice-%-41.batch.log"


# -- command line over directives -----------------------------------------------------------

def test_command_line_options_override_directives() -> None:
    job = batch("-J script-name", "-p short", "-t 10", "--gres=gpu:1", cli=["-J", "cli", "--partition=long", "-t2:00:00"])
    spec = spec_of(job)
    assert spec.name == "cli" and spec.scheduling.partition == "long" and spec.time_limit == 7200
    assert spec.tasks[0].resources.gpus == 1  # not overridden: the script's own
    given, rest, issues, _ = parse_command_line(["--wait", "-N2", "train.sbatch", "--lr", "0.1"])
    assert rest == ["train.sbatch", "--lr", "0.1"] and not issues and given["nodes"].value == 2


def test_script_arguments_reach_the_script() -> None:
    job = load_batch(script(), source="x.sbatch", args=("a b", "c"))
    assert "'a b' c &" in job.documents[0]["run"]


# -- warnings and errors --------------------------------------------------------------------

def test_options_without_meaning_here_are_warned_by_name_with_their_line() -> None:
    job = batch("--mail-type=END,FAIL", "--mail-user=a@b.c", "--hint=nomultithread", "--reservation=r1", "-O")
    text = "\n".join(job.warnings)
    for name, line in (("--mail-type", 2), ("--mail-user", 3), ("--hint", 4), ("--reservation", 5), ("-O", 6)):
        assert f"{name}" in text and f"(line {line})" in text


@pytest.mark.parametrize("directive, option, message", [
    ("--nodes=zero", "--nodes", "not a whole number"),
    ("--bogus=1", "--bogus", "unknown sbatch option"),
    ("-Z", "-Z", "unknown sbatch option"),
    ("--time=abc", "--time", "not a Slurm time"),
    ("--mem=lots", "--mem", "not a memory size"),
    ("--gres=nvme:1", "--gres", "not one corral schedules"),
    ("--signal=KILL@10", "--signal", "not a signal corral sends"),
    ("--array=5-1", "--array", "ends before it starts"),
    ("--dependency=afterok", "--dependency", "at least one"),
    ("--dependency=afterok:3_1", "--dependency", "array elements"),
    ("--output=out-%q.log", "--output", "%q is not a filename pattern"),
    ('--job-name="!!!"', "--job-name", "not a job name"),
    ("--constraint=a&&b", "--constraint", "not a constraint"),
    ("--kill-on-invalid-dep=maybe", "--kill-on-invalid-dep", "yes or no"),
    ("--partition", "--partition", "needs a value"),
])
def test_malformed_directives_are_errors_with_option_and_line(directive: str, option: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_batch(script("-J fine", directive), source="bad.sbatch")
    issue = caught.value.issues[0]
    assert issue.field == option and issue.line == 3 and message in issue.message
    assert "bad.sbatch:3:" in str(caught.value)


def test_inconsistent_requests_are_errors() -> None:
    with pytest.raises(SpecError, match="do not split evenly"):
        batch("-N 2", "--gpus=3")
    with pytest.raises(SpecError, match="give the GPUs once"):
        batch("--gres=gpu:1", "--gpus-per-node=2")
    with pytest.raises(SpecError, match="cannot cover"):
        batch("-N 3", "-n 2")
    with pytest.raises(SpecError, match="names 3 nodes"):
        batch("-N 2", "-w gpu-[0-2]")


def test_command_line_errors_name_the_command_line() -> None:
    _, _, issues, _ = parse_command_line(["--nodes", "x", "s.sbatch"])
    assert issues[0].field == "--nodes" and issues[0].line is None and issues[0].document == "command line"


# -- arrays ---------------------------------------------------------------------------------

def test_array_syntax() -> None:
    assert parse_array("0-3").indices == (0, 1, 2, 3) and parse_array("0-3").throttle is None
    spec = parse_array("1,3,5-9:2%2")
    assert spec.indices == (1, 3, 5, 7, 9) and spec.throttle == 2
    assert fold([3, 4, 5, 7, 9, 10], 4) == "3-5,7,9-10%4"
    for bad in ("", "a", "1-", "3-1", "0-9%0", "1-5:0", "0-99999999"):
        with pytest.raises(ValueError):
            parse_array(bad)


# -- srun's layout and scontrol ---------------------------------------------------------------

NODES = [{"name": "gpu-0", "gpus": [0, 1, 2, 3]}, {"name": "gpu-1", "gpus": [4, 5, 6, 7]},
         {"name": "gpu-2", "gpus": [0, 1, 2, 3]}]


def layout(argv: list[str], env: dict | None = None) -> list[tuple]:
    opts, command = parse_args(argv + ["cmd"])
    assert command == ["cmd"]
    return [(t["rank"], t["node"], t["node_index"], t["local"], tuple(t["gpus"]))
            for t in plan_step(opts, NODES, env or {"SLURM_NTASKS": "3"})]


def test_srun_spreads_tasks_and_splits_gpus() -> None:
    assert layout([]) == [(0, "gpu-0", 0, 0, (0, 1, 2, 3)), (1, "gpu-1", 1, 0, (4, 5, 6, 7)),
                          (2, "gpu-2", 2, 0, (0, 1, 2, 3))]
    assert layout(["-N2", "--ntasks-per-node=2", "--gpus-per-task=2"]) == [
        (0, "gpu-0", 0, 0, (0, 1)), (1, "gpu-0", 0, 1, (2, 3)), (2, "gpu-1", 1, 0, (4, 5)), (3, "gpu-1", 1, 1, (6, 7))]
    assert layout(["-n", "1", "-w", "gpu-2"]) == [(0, "gpu-2", 2, 0, (0, 1, 2, 3))]
    assert layout(["-N", "1", "-n", "2", "--exact"]) == [(0, "gpu-0", 0, 0, (0, 1)), (1, "gpu-0", 0, 1, (2, 3))]
    assert layout(["-n2"], {"SLURM_GPUS_PER_TASK": "1"}) == [(0, "gpu-0", 0, 0, (0,)), (1, "gpu-1", 1, 0, (4,))]
    # --exclude: the job's other nodes (the usual "every node but the head" step)
    assert layout(["-x", "gpu-0", "--ntasks-per-node=1"]) == [(0, "gpu-1", 1, 0, (4, 5, 6, 7)), (1, "gpu-2", 2, 0, (0, 1, 2, 3))]
    assert layout(["--exclude=gpu-[0-1]", "-n", "1"]) == [(0, "gpu-2", 2, 0, (0, 1, 2, 3))]


def test_srun_refuses_what_the_allocation_cannot_give() -> None:
    for argv, message in ((["-w", "gpu-9"], "not in the job's allocation"), (["-N", "4"], r"3 node\(s\)"),
                          (["-N1", "-n3", "--gpus-per-task=2"], "not enough"), (["--frobnicate"], "unrecognized"),
                          (["-n", "0"], "--ntasks=0: at least 1"), (["--ntasks-per-node=0"], "at least 1"),
                          (["-w", ""], "names no node"), (["-x", "gpu-[0-2]"], "leaves none")):
        with pytest.raises(UsageError, match=message):
            opts, _ = parse_args(argv + ["cmd"])
            plan_step(opts, NODES, {"SLURM_NTASKS": "3"})


def test_scontrol_show_hostnames(capsys, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[0-2],cpu-7")
    assert scontrol(["show", "hostnames"]) == 0
    assert capsys.readouterr().out.split() == ["gpu-0", "gpu-1", "gpu-2", "cpu-7"]
    assert scontrol(["show", "hostnames", "n[1-2]"]) == 0 and capsys.readouterr().out.split() == ["n1", "n2"]
    assert scontrol(["show", "hostlist", "n1,n2,n3"]) == 0 and capsys.readouterr().out.strip() == "n[1-3]"
    assert scontrol(["show", "partition"]) == 1


def test_batch_environment() -> None:
    s = BatchStep(role="batch", nodes=2, ntasks=4, ntasks_per_node=2, cpus_per_task=3, gpus_per_node=2,
                  submit_dir="/sub")
    ctx = slurmjob.BatchContext(9, "train", "alice", "batch", "ml", "normal", 600.0, 1, 8, 1,
                                (slurmjob.NodeSlot("gpu-1", (2, 3), 6, "127.1.0.1"),
                                 slurmjob.NodeSlot("gpu-0", (0, 1), 6, "127.1.0.2")), "/sub")
    env = slurmjob.batch_env(s, ctx, None)
    expected = {"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": "gpu-1,gpu-0",
                "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "3",
                "SLURM_GPUS_PER_NODE": "2", "SLURM_SUBMIT_DIR": "/sub", "SLURM_ARRAY_JOB_ID": "8",
                "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_PARTITION": "batch", "SLURM_JOB_ACCOUNT": "ml",
                "SLURM_RESTART_COUNT": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURMD_NODENAME": "gpu-1",
                "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "2(x2)",
                "CORRAL_SBATCH_OUTPUT": "/sub/slurm-8_1.out"}
    assert {k: env.get(k) for k in expected} == expected
    assert "CORRAL_SLURM_SHIMS" not in env  # none given
    from pathlib import Path
    from corral.executors.slurm.layout import batch_layout

    on_slurm = slurmjob.batch_env(s, ctx, Path("/x"))
    assert on_slurm["CORRAL_SLURM_SHIMS"] == "/x"
    # in a real allocation: the real srun (through corral's only for Pyxis's options, ``node.slurmstep``),
    # with Slurm's own variables, the job's layout set over the step's
    command = batch_layout(on_slurm, ["h1", "h0"], {"h1": 6, "h0": 6})
    assert on_slurm["CORRAL_SLURM_SHIMS"] == "/x/slurm" and not any(k.startswith("SLURM") for k in on_slurm)
    assert on_slurm["CORRAL_SBATCH_OUTPUT"] == "/sub/slurm-8_1.out"
    assert command[0] == "env" and "SLURM_JOB_NODELIST=h1,h0" in command and "SLURM_OVERLAP=1" in command
    assert "SLURM_PROCID=0" in command and "SLURM_JOB_ID=9" not in command  # the job's identity stays Slurm's
    assert "SLURM_NTASKS=4" in command  # asked for (-n 4): set over the step's
    unasked = slurmjob.batch_env(BatchStep(role="batch", nodes=2, ntasks=2, ntasks_given=False, submit_dir="/sub"), ctx,
                                 Path("/x"))
    command = batch_layout(unasked, ["h1", "h0"], {})
    assert not any(a.startswith("SLURM_NTASKS=") for a in command)  # srun's own -n decides
    # ... not the holding step's own count (1), which would be srun's -n: srun -N2 would run one task
    assert "SLURM_NTASKS" in command[command.index("-u", command.index("SLURM_DISTRIBUTION")):]


# -- the scheduler: constraints, distinct nodes, whole nodes, array throttles ---------------------

def labelled(name: str, **labels: str):
    from dataclasses import replace
    return replace(node(name, gpus=4, cpus=8), labels=tuple(sorted(labels.items())))


def test_constraint_and_nodelist_choose_nodes() -> None:
    from dataclasses import replace
    nodes = [labelled("a", ib="yes"), labelled("b", switch="leaf1"), labelled("c")]
    want_ib = PendingJob(1, (replace(task(gpus=1), constraint="ib"),))
    want_leaf = PendingJob(2, (replace(task(gpus=1), constraint="switch=leaf1|nothing"),))
    named = PendingJob(3, (replace(task(gpus=1), nodes=frozenset({"c"})),))
    plan = schedule(snapshot(nodes, [want_ib, want_leaf, named]), 0.0, Policy())
    assert {s.job_id: s.allocations[0].node for s in plan.starts} == {1: "a", 2: "b", 3: "c"}
    nowhere = PendingJob(4, (replace(task(), constraint="a100"),))
    assert "constraint a100" in why_infeasible(nodes, nowhere)


def test_distinct_replicas_take_one_node_each_and_exclusive_takes_it_whole() -> None:
    from dataclasses import replace
    nodes = [node("n0", gpus=8), node("n1", gpus=8), node("n2", gpus=8)]
    spread = PendingJob(1, (replace(task("batch", gpus=1), distinct=True),
                            replace(task("node", replicas=2, gpus=1), distinct=True)))
    start = schedule(snapshot(nodes, [spread]), 0.0, Policy()).starts[0]
    assert len({a.node for a in start.allocations}) == 3
    leaves = [replace(n, labels=(("leaf", "l0"),)) for n in nodes]  # placed by switch when a site has a topology
    start = schedule(snapshot(leaves, [spread]), 0.0, Policy(topology=("leaf",))).starts[0]
    assert len({a.node for a in start.allocations}) == 3
    too_many = PendingJob(2, (replace(task("node", replicas=4), distinct=True),))
    assert "4 distinct nodes" in why_infeasible(nodes, too_many)
    whole = PendingJob(3, (replace(task(gpus=1), exclusive=True),))
    alloc = schedule(snapshot(nodes, [whole]), 0.0, Policy()).starts[0].allocations[0]
    assert len(alloc.gpus) == 8 and alloc.cpus == 32


def test_array_throttle_caps_running_elements() -> None:
    nodes = [node("n0", gpus=8)]
    elements = [PendingJob(i, (task(gpus=1),), float(i), array=(10, 2)) for i in range(11, 15)]
    plan = schedule(snapshot(nodes, elements), 0.0, Policy())
    assert [s.job_id for s in plan.starts] == [11, 12]
    assert plan.reasons[13] == plan.reasons[14] == Reason.ARRAY_LIMIT
    running = RunningJob(10, (Allocation("main", 0, "n0", (0,), 0.1, 0.0),), float("inf"), array_id=10)
    from corral.scheduler import Snapshot
    plan = schedule(Snapshot(tuple(nodes), tuple(elements), (running,)), 0.0, Policy())
    assert [s.job_id for s in plan.starts] == [11]


def _srun(tmp_path, *argv: str) -> tuple[int, float, str]:
    """Run corral's srun as a batch script would, on a two-node layout (real processes)."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "CORRAL_HOSTS_FILE": str(tmp_path / "hosts"),
           "CORRAL_SBATCH_NODES": json.dumps([{"name": "n0", "gpus": [0]}, {"name": "n1", "gpus": [1]}])}
    runner = Path(slurmjob.__file__).parents[1] / "node" / "srun.py"
    began = time.monotonic()
    proc = subprocess.run([sys.executable, str(runner), "srun", *argv], env=env, capture_output=True, text=True,
                          timeout=30)
    return proc.returncode, time.monotonic() - began, proc.stdout + proc.stderr


def test_srun_kill_on_bad_exit_wait_labels_and_step_ids(tmp_path) -> None:
    slow = 'if [ "$SLURM_PROCID" = 0 ]; then exit {code}; fi; sleep 20'
    code, took, _ = _srun(tmp_path, "-K", "bash", "-c", slow.format(code=3))
    assert took < 6 and code == 128 + 15  # the other task was stopped (SIGTERM): the highest code
    code, took, text = _srun(tmp_path, "--wait=1", "bash", "-c", slow.format(code=0))
    assert 1 <= took < 6 and "--wait" in text
    code, took, text = _srun(tmp_path, "-l", "--mem=1G", "bash", "-c", 'echo "on $SLURMD_NODENAME $SLURM_STEP_ID"')
    assert code == 0 and "0: on n0 2" in text and "1: on n1 2" in text and "--mem ignored" in text
    assert "1: on n1 3" in _srun(tmp_path, "-l", "bash", "-c", 'echo "on $SLURMD_NODENAME $SLURM_STEP_ID"')[2]
