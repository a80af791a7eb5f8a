"""What a Slurm batch script's replicas see at launch: Slurm's job variables, the job's node
layout for ``srun``, the ``--output``/``--error`` files, and where the ``srun``/``scontrol``
commands come from.

How a batch job holds its nodes on corral's queue (see ``corral.spec.sbatch``): the primary
task ``batch`` (one replica) runs the script on the job's first node; the auxiliary task
``node`` holds each other node with one replica that waits until the script ends. Every
replica is placed by the scheduler on a node of its own, so ``SLURM_JOB_NODELIST`` is the
corral nodes those replicas were placed on, batch node first, and each node's GPUs are the
ones its replica holds.

``srun`` and ``scontrol`` are corral's own commands (``corral.node.srun``), put first on the
script's PATH through ``CORRAL_SLURM_SHIMS``. The local executor's nodes are all this
machine: ``srun`` starts the batch node's tasks itself, as processes of the batch replica,
and each other node's inside that node's holder replica through its step agent
(``corral.node.stepagent``), each with the environment of the node it stands for
(``SLURMD_NODENAME``, that node's GPUs in ``CUDA_VISIBLE_DEVICES``). An infra that runs
replicas inside real Slurm allocations replaces this layout with Slurm's own at launch (the
Slurm executor, ``corral.executors.slurm.layout``): the variables named in ``LAYOUT`` describe the job's
shape, the rest its identity."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from corral.spec.batchstep import BatchStep

# the batch step's variables that describe the job's shape (not its identity), set over the
# step's own on a real Slurm
LAYOUT = frozenset({"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS",
                    "SLURM_NPROCS", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
                    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_JOB_NAME", "SLURM_SUBMIT_DIR",
                    "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                    "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                    "SLURM_ARRAY_TASK_STEP"})
NO_ARRAY_INDEX = "4294967294"  # what Slurm puts in %a for a job that is not an array element
# Slurm's variables of a task's layout, set for every replica on every infra (``task_layout``):
# over a real Slurm step's own, which describe that step alone (one node, one task)
TASK_LAYOUT = frozenset({"SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_NODEID",
                         "SLURM_LOCALID", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                         "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
                         "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_NAME"})
# the variables that name nodes (hostlists): an infra whose node names are not the machines'
# rewrites them (``rename_nodes``)
NODE_LISTS = ("SLURM_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
# an array's extent, as sbatch sets it for every element
ARRAY_EXTENT = ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP")


# what each component of a heterogeneous job has of its own: set as NAME_HET_GROUP_k for every
# component k (``het_env``), and as NAME for component 0 in the script; corral's srun sets a
# step's NAME from its component's (``corral.node.srun``)
HET_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES",
            "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
            "SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
            "SLURM_JOB_GPUS", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS")


@dataclass(frozen=True)
class NodeSlot:
    name: str
    gpus: tuple[int, ...]
    cpus: float
    addr: str
    task: str = ""  # the task whose replica holds it (which component of a heterogeneous job)


@dataclass(frozen=True)
class BatchContext:
    job_id: int
    job_name: str
    user: str
    partition: str
    account: str
    qos: str
    time_limit: float | None
    restart_count: int
    array_job_id: int | None
    array_index: int | None
    nodes: tuple[NodeSlot, ...]  # the batch node first
    workdir: str
    array_extent: tuple[int, ...] | None = None  # an array's (count, min, max, step)


def hostlist(names: list[str] | tuple[str, ...]) -> str:
    """The compressed form (``gpu-[0-3]``) that keeps the batch node first, as in Slurm, where
    it is the allocation's first node: runs the library compresses are joined in order."""
    from hostlist import collect_hostlist, expand_hostlist

    names = list(names)
    whole = collect_hostlist(names) if names else ""
    if expand_hostlist(whole) == names:
        return whole
    runs: list[list[str]] = []
    for name in names:
        if runs and expand_hostlist(collect_hostlist(runs[-1] + [name])) == runs[-1] + [name]:
            runs[-1].append(name)
        else:
            runs.append([name])
    return ",".join(collect_hostlist(run) for run in runs)


def task_layout(rank: int, nodes: tuple[str, ...] | list[str], job_nodes: tuple[str, ...] | list[str]
                ) -> dict[str, str]:
    """Slurm's task variables of replica ``rank`` of a task, as if the task were one ``srun``
    step and each replica one task of it: ``nodes`` is the node of every replica by rank
    ("" for one not placed), ``job_nodes`` the nodes of the whole job.

    ``SLURM_PROCID`` is the rank and ``SLURM_NTASKS`` the replica count; the task's nodes, in
    the order of their first replica, are the step's (``SLURM_NODELIST``, ``SLURM_NNODES``),
    ``SLURM_NODEID`` is the index of the replica's node among them and ``SLURM_LOCALID`` its
    index among the replicas on that node (by rank), as Slurm numbers them; the job's nodes
    (sorted, as Slurm lists an allocation) are ``SLURM_JOB_NODELIST``. ``SLURM_NTASKS_PER_NODE``
    is set when every node holds as many replicas (as with ``--ntasks-per-node``)."""
    from hostlist import collect_hostlist

    placed = [n for n in nodes if n]
    order = list(dict.fromkeys(placed))
    counts = [placed.count(n) for n in order]
    mine = nodes[rank] if 0 <= rank < len(nodes) else ""
    node_id = order.index(mine) if mine in order else 0
    local = sum(1 for n in nodes[:rank] if n == mine) if mine else 0
    whole = sorted(set(job_nodes) | set(order))
    env = {
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(len(nodes)), "SLURM_NPROCS": str(len(nodes)),
        "SLURM_STEP_NUM_TASKS": str(len(nodes)),
        "SLURM_NODEID": str(node_id), "SLURM_LOCALID": str(local),
        "SLURM_NNODES": str(len(order)), "SLURM_STEP_NUM_NODES": str(len(order)),
        "SLURM_NODELIST": hostlist(order), "SLURM_STEP_NODELIST": hostlist(order),
        "SLURM_TASKS_PER_NODE": compressed_counts(counts), "SLURM_STEP_TASKS_PER_NODE": compressed_counts(counts),
        "SLURM_JOB_NODELIST": collect_hostlist(whole) if whole else "", "SLURM_JOB_NUM_NODES": str(len(whole)),
    }
    if counts and len(set(counts)) == 1:
        env["SLURM_NTASKS_PER_NODE"] = str(counts[0])
    return env


def rename_nodes(env: dict[str, str], rename) -> None:
    """Rewrite the node lists of ``env`` (in place) with ``rename(node) -> machine name``: for
    an infra whose corral node names are not the names its own tools know."""
    from hostlist import collect_hostlist, expand_hostlist

    for name in NODE_LISTS:
        if env.get(name):
            hosts = [rename(n) for n in expand_hostlist(env[name])]
            env[name] = collect_hostlist(sorted(set(hosts))) if name == "SLURM_JOB_NODELIST" else hostlist(hosts)


def array_extent(extent: tuple[int, int, int, int] | list[int] | None) -> dict[str, str]:
    """``SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP`` of an array of this extent (``ArraySpec.extent``)."""
    return dict(zip(ARRAY_EXTENT, (str(v) for v in extent))) if extent else {}


def tasks_per_node(step: BatchStep) -> list[int]:
    """How ``ntasks`` spread over the nodes: ``--ntasks-per-node`` each, else block
    distribution (the first nodes get one more when it does not divide)."""
    if step.ntasks_per_node:
        return [step.ntasks_per_node] * step.nodes
    base, extra = divmod(step.ntasks, step.nodes)
    return [base + (1 if i < extra else 0) for i in range(step.nodes)]


def compressed_counts(counts: list[int]) -> str:
    """Slurm's ``2(x3),1`` form of per-node task counts."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        out.append(str(counts[i]) + (f"(x{j - i + 1})" if j > i else ""))
        i = j + 1
    return ",".join(out)


def expand_pattern(pattern: str, ctx: BatchContext, node: str, job_id: bool = True) -> str:
    """sbatch's filename patterns; a number after ``%`` zero-pads numeric fields. Without
    ``job_id``, ``%j`` and ``%J`` are left for ``fill_job_id`` (and every other ``%`` is
    doubled): for an infra where the job's id is the engine's, known only at launch."""
    array_id = str(ctx.array_job_id if ctx.array_job_id is not None else ctx.job_id)
    index = str(ctx.array_index) if ctx.array_index is not None else NO_ARRAY_INDEX
    values = {"j": str(ctx.job_id), "J": f"{ctx.job_id}.batch", "x": ctx.job_name, "A": array_id, "a": index,
              "N": node, "n": "0", "t": "0", "s": "batch", "u": ctx.user}

    def fill(match: re.Match) -> str:
        width, code = match.group(1), match.group(2)
        if code == "%":
            return "%" if job_id else "%%"
        if not job_id and code in "jJ":
            return match.group(0)
        value = values[code]
        value = value.zfill(int(width)) if width and value.isdigit() else value
        return value if job_id else value.replace("%", "%%")

    path = re.sub(r"%(\d*)([jJxAaNntsu%])", fill, pattern)
    if path.startswith("/"):
        return path
    return os.path.join(ctx.workdir if job_id else ctx.workdir.replace("%", "%%"), path)


def fill_job_id(path: str, job_id: str) -> str:
    """A path ``expand_pattern`` left ``%j``/``%J`` in, with the job's id."""
    def fill(match: re.Match) -> str:
        width, code = match.group(1), match.group(2)
        if code == "%":
            return "%"
        value = job_id.zfill(int(width)) if width and job_id.isdigit() else job_id
        return value if code == "j" else f"{value}.batch"

    return re.sub(r"%(\d*)([jJ%])", fill, path)


def batch_env(step: BatchStep, ctx: BatchContext, shims: Path | None, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """Slurm's variables for the batch script (the batch step: node 0, task 0). With
    ``--export=NONE`` the script starts with only these, corral's own, the basics of a login
    (PATH, HOME, USER …) and ``keep`` (the variables the job names)."""
    every = ctx.nodes
    if step.het:  # the script's own variables are its component's (0); each component's, suffixed
        ctx = replace(ctx, nodes=tuple(het_groups(step, every)[0]))
    names = [n.name for n in ctx.nodes]
    counts = tasks_per_node(step)
    first = ctx.nodes[0]
    env = {
        "SLURM_JOB_ID": str(ctx.job_id), "SLURM_JOBID": str(ctx.job_id), "SLURM_JOB_NAME": ctx.job_name,
        "SLURM_JOB_NODELIST": hostlist(names), "SLURM_NODELIST": hostlist(names),
        "SLURM_NNODES": str(len(names)), "SLURM_JOB_NUM_NODES": str(len(names)),
        "SLURM_NTASKS": str(step.ntasks), "SLURM_NPROCS": str(step.ntasks),
        "SLURM_TASKS_PER_NODE": compressed_counts(counts),
        "SLURM_CPUS_PER_TASK": str(step.cpus_per_task),
        "SLURM_JOB_CPUS_PER_NODE": compressed_counts([int(n.cpus) or 1 for n in ctx.nodes]),
        "SLURM_CPUS_ON_NODE": str(int(first.cpus) or 1),
        "SLURM_SUBMIT_DIR": step.submit_dir, "SLURM_SUBMIT_HOST": os.uname().nodename,
        "SLURM_JOB_PARTITION": ctx.partition, "SLURM_JOB_ACCOUNT": ctx.account, "SLURM_JOB_QOS": ctx.qos,
        "SLURM_JOB_USER": ctx.user, "SLURM_CLUSTER_NAME": "corral",
        "SLURM_RESTART_COUNT": str(ctx.restart_count),
        "SLURMD_NODENAME": first.name, "SLURM_TOPOLOGY_ADDR": first.name,
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_JOB_GPUS": ",".join(str(g) for g in first.gpus),
        "CORRAL_SBATCH_NODES": json.dumps([{"name": n.name, "gpus": list(n.gpus), "cpus": n.cpus, "addr": n.addr}
                                           for n in ctx.nodes]),
    }
    if step.het:  # srun --het-group=k runs on the nodes of component k
        groups = het_groups(step, every)
        env["CORRAL_SBATCH_NODES"] = json.dumps([{"name": n.name, "gpus": list(n.gpus), "cpus": n.cpus,
                                                  "addr": n.addr, "group": k}
                                                 for k, slots in enumerate(groups) for n in slots])
        env.update(het_env(step, replace(ctx, nodes=every)))
    if step.ntasks_per_node:
        env["SLURM_NTASKS_PER_NODE"] = str(step.ntasks_per_node)
    if step.gpus_per_node:
        env["SLURM_GPUS_PER_NODE"] = str(step.gpus_per_node)
        env["SLURM_GPUS_ON_NODE"] = str(len(first.gpus))
    if step.gpus_per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = str(step.gpus_per_task)
    if ctx.time_limit is not None:
        env["SLURM_JOB_TIME_LIMIT"] = str(int(ctx.time_limit))
    if ctx.array_job_id is not None and ctx.array_index is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(ctx.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(ctx.array_index)
        env.update(array_extent(ctx.array_extent))
    output = step.output or ("slurm-%A_%a.out" if ctx.array_index is not None else "slurm-%j.out")
    env["CORRAL_SBATCH_OUTPUT"] = expand_pattern(output, ctx, first.name)
    # where the job's id is the engine's (a Slurm allocation's), its executor fills %j in these
    env["CORRAL_SBATCH_OUTPUT_PATTERN"] = expand_pattern(output, ctx, first.name, job_id=False)
    if step.error:
        env["CORRAL_SBATCH_ERROR"] = expand_pattern(step.error, ctx, first.name)
        env["CORRAL_SBATCH_ERROR_PATTERN"] = expand_pattern(step.error, ctx, first.name, job_id=False)
    if step.warn_signal:
        env["CORRAL_SBATCH_BATCH_SIGNAL" if step.signal_batch_only else "CORRAL_SBATCH_STEP_SIGNAL"] = step.warn_signal
    if step.export_none:
        env["CORRAL_SBATCH_EXPORT_NONE"] = "1"
        env["CORRAL_SBATCH_KEEP"] = " ".join(keep)
    if step.ntasks_given:  # as sbatch: without it, a real srun's task count follows its own -N/-n
        env["CORRAL_SBATCH_NTASKS_GIVEN"] = "1"
    if shims is not None:
        env["CORRAL_SLURM_SHIMS"] = str(shims)
    if step.container is not None:  # #SBATCH --container-image: the script runs in it (``node.stepcontainer``)
        env["CORRAL_SBATCH_CONTAINER"] = json.dumps(step.container, sort_keys=True)
        if shims is not None:  # kept where Slurm's own srun replaces the shims (the Slurm infra)
            env["CORRAL_SBATCH_BOX"] = str(shims / "corral-container")
    return env


def script_image(env: dict[str, str]) -> str | None:
    """The image a batch script runs in (``#SBATCH --container-image``), if it asked for one."""
    try:
        return json.loads(env["CORRAL_SBATCH_CONTAINER"]).get("image") or None
    except (KeyError, ValueError, AttributeError):
        return None


def het_groups(step: BatchStep, nodes: tuple[NodeSlot, ...]) -> list[list[NodeSlot]]:
    """The nodes of each component of a heterogeneous job, in the order given (the batch node
    first)."""
    return [[n for n in nodes if n.task in group.tasks] for group in step.het]


def het_env(step: BatchStep, ctx: BatchContext) -> dict[str, str]:
    """Slurm's variables of a heterogeneous job's components: ``SLURM_HET_SIZE`` and, for each
    component k, ``NAME_HET_GROUP_k`` for the names of ``HET_VARS``. corral runs the components
    as one job, so every component's job id is the job's."""
    env = {"SLURM_HET_SIZE": str(len(step.het))}
    for index, (group, slots) in enumerate(zip(step.het, het_groups(step, ctx.nodes))):
        names = [n.name for n in slots]
        layout = {
            "SLURM_JOB_ID": str(ctx.job_id), "SLURM_JOB_NAME": group.job_name,
            "SLURM_JOB_NODELIST": hostlist(names), "SLURM_NODELIST": hostlist(names),
            "SLURM_JOB_NUM_NODES": str(len(names)), "SLURM_NNODES": str(len(names)),
            "SLURM_NTASKS": str(group.ntasks), "SLURM_NPROCS": str(group.ntasks),
            "SLURM_TASKS_PER_NODE": compressed_counts(tasks_per_node(group)),
            "SLURM_CPUS_PER_TASK": str(group.cpus_per_task),
            "SLURM_JOB_CPUS_PER_NODE": compressed_counts([int(n.cpus) or 1 for n in slots]),
            "SLURM_JOB_GPUS": ",".join(str(g) for g in slots[0].gpus) if slots else "",
            "SLURM_JOB_PARTITION": ctx.partition, "SLURM_JOB_ACCOUNT": ctx.account, "SLURM_JOB_QOS": ctx.qos,
        }
        if group.ntasks_per_node:
            layout["SLURM_NTASKS_PER_NODE"] = str(group.ntasks_per_node)
        if group.gpus_per_node:
            layout["SLURM_GPUS_PER_NODE"] = str(group.gpus_per_node)
        if group.gpus_per_task is not None:
            layout["SLURM_GPUS_PER_TASK"] = str(group.gpus_per_task)
        env.update({f"{name}_HET_GROUP_{index}": value for name, value in layout.items()})
    return env


def hand_over_job_files(job_dir: Path, env: dict[str, str], account, base: Path) -> None:
    """Make what a batch script's replica writes beside its job's runtime files, and hand it to
    the job's account (``corral.auth.accounts.hand_over``), where its replicas run as another
    account than the server's: the script itself (``spec.batchshell``), its steps' counter
    (``node.srun``, off Slurm) and the directory of its named containers
    (``node.namedcontainer``)."""
    from corral.auth.accounts import hand_over

    if "CORRAL_SBATCH_NODES" not in env or "CORRAL_LAUNCH_KEY" not in env:
        return
    files = [f"sbatch.{env['CORRAL_LAUNCH_KEY']}"] + ([f"steps.{env['SLURM_JOB_ID']}"] if "SLURM_JOB_ID" in env else [])
    for name in files:
        hand_over(job_dir / name, account, base, directory=False)
    named = env.get("CORRAL_NAMED_CONTAINERS")  # under the server's home (``node.namedcontainer``)
    if named:
        hand_over(Path(named), account, Path(named).parents[2])


def ensure_shims(directory: Path) -> Path:
    """Write ``srun``, ``scontrol``, ``corral-container`` (a batch script in its container,
    ``corral.node.stepcontainer``) and ``corral-stepd`` (a holder's step agent,
    ``corral.node.stepagent``) commands that run ``corral.node.srun`` with this server's
    Python (which has corral and its libraries), whatever the job's PYTHONPATH; and in
    ``slurm/``, the ``srun`` a batch script runs on a Slurm infra: Slurm's own, through
    ``corral.node.slurmstep`` when a line gives Pyxis's options (``SLURM_SRUN``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "slurm").mkdir(exist_ok=True)
    (directory / "slurm").chmod(0o711)  # run by the job's account, as the directory above (``open_discovery``)
    runner = (Path(__file__).parents[1] / "node" / "srun.py").resolve()
    python = _sh(sys.executable)
    texts = {}
    for command in ("srun", "scontrol", "corral-container", "corral-stepd"):
        # (a job of another account cannot run a Python kept in the server account's private
        # home: say so, rather than the shell's bare "Permission denied")
        texts[command] = (f"#!/bin/sh\nif [ ! -x {python} ]; then\n"
                          f"  echo \"{command}: corral's {command} runs with the server's Python, $(printf %s {python}),"
                          f" which the account $(id -un) may not run: install corral where every account may read it\" >&2\n"
                          f"  exit 127\nfi\n"
                          # a holder asks first, so where its account cannot run it, it holds as before
                          + ('[ "${1:-}" = --runnable ] && exit 0\n' if command == "corral-stepd" else "")
                          + f"exec {python} {_sh(str(runner))} {command} \"$@\"\n")
    texts["slurm/srun"] = SLURM_SRUN.replace("PYTHON", python).replace("RUNNER", _sh(str(runner))) \
        .replace("HERE", _sh(str(directory / "slurm")))
    for command, text in texts.items():
        path = directory / command
        if not path.exists() or path.read_text() != text:
            temp = path.parent / f".{path.name}.tmp"
            temp.write_text(text)
            temp.chmod(0o755)
            temp.replace(path)
    return directory


# A batch script's srun on a Slurm infra: Slurm's own (the next srun on PATH), untouched unless
# a word starts with --container- (Pyxis's options): then corral.node.slurmstep decides (Slurm's
# own where the site has Pyxis; else corral runs the step's containers inside Slurm's step).
SLURM_SRUN = """#!/bin/sh
case " $* " in *" --container-"*)
  if [ ! -x PYTHON ]; then
    echo "srun: corral runs Pyxis's options with the server's Python, $(printf %s PYTHON), which the account $(id -un) may not run: install corral where every account may read it" >&2
    exit 127
  fi
  exec PYTHON RUNNER slurm-srun "$@" ;;
esac
__here=HERE
IFS=:
for __dir in $PATH; do
  if [ -n "$__dir" ] && [ "$__dir" != "$__here" ] && [ -x "$__dir/srun" ]; then unset IFS; exec "$__dir/srun" "$@"; fi
done
echo "srun: command not found" >&2
exit 127
"""


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
