"""What a replica's Slurm step is started with, over what Slurm sets for the step itself (one
node, one task): the replica's place in its task and job as corral's Slurm variables describe
it on every infra (``corral.runtime.batchenv``), a batch script's job layout, and the umask
its files are created with. Who and where the job is (its id, the step's id, the GPUs its GRES
bound) stay Slurm's."""

from __future__ import annotations

import json
import os

from corral.executors.contract import LaunchError
from corral.runtime.batchenv import (ARRAY_EXTENT, LAYOUT, TASK_LAYOUT, compressed_counts, fill_job_id, hostlist,
                                     rename_nodes)


def step_variables(env: dict[str, str], alloc, allocations) -> list[str]:  # noqa: ANN001 - an Allocation, Allocations
    """Slurm's variables for a step in allocation ``alloc`` (``VAR=value`` for its command line:
    they go in over the step's own; the srun client gets none of them, it would read them as its
    options). A batch script's ``env`` is made as under sbatch first: its host name is the node's,
    its job id (and so ``%j`` in its files) the allocation's."""
    if "CORRAL_SBATCH_NODES" not in env:
        return step_layout(env, allocations.host_of)
    if "SLURM_HET_SIZE" in env:  # (corral.spec.hetjob)
        # inside one Slurm allocation the script's srun is Slurm's own, which knows no
        # components of a corral job (--het-group would be refused, a plain srun would
        # span every component's nodes)
        raise LaunchError("a heterogeneous batch script (#SBATCH hetjob) does not run in a partition whose "
                          "nodes are Slurm allocations: submit it to a partition of corral's own nodes, or "
                          "to Slurm's sbatch")
    env.pop("CORRAL_HOSTNAME", None)
    for name in ("OUTPUT", "ERROR"):
        pattern = env.pop(f"CORRAL_SBATCH_{name}_PATTERN", None)
        if pattern is not None:
            env[f"CORRAL_SBATCH_{name}"] = fill_job_id(pattern, alloc.slurm_id)
    hosts = [allocations.where(n["name"])[1] for n in json.loads(env.get("CORRAL_SBATCH_NODES", "[]"))]
    return batch_layout(env, hosts, {share.host: share.cpus for share in alloc.info.nodes})


def batch_layout(env: dict[str, str], hosts: list[str], cpus: dict[str, int]) -> list[str]:
    """A Slurm batch script's replica, given the job's layout as corral's batch environment
    describes it (``corral.runtime.batchenv``; ``env`` is changed in place), as the ``env``
    command that starts it inside its step. Inside a real allocation Slurm sets the step's own
    variables (one node, one task) and the real ``srun`` reads them: the job's layout is set
    over them (all the job's ``hosts``, its task counts), Slurm's own srun is used (through
    corral's where a line gives Pyxis's options and the site has no Pyxis), and
    the script's own srun steps overlap the steps holding the job's nodes (``SLURM_OVERLAP``),
    as they would in a batch step. Who and where the job is (its id, partition, account) stay
    Slurm's."""
    layout = {k: env.pop(k) for k in list(env) if k in LAYOUT}
    unset = ["SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
             "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST",
             "SLURM_CPU_BIND_TYPE", "SLURM_DISTRIBUTION"]
    if env.pop("CORRAL_SBATCH_NTASKS_GIVEN", None) is None:  # as sbatch: srun's count follows its own -N/-n
        layout.pop("SLURM_NTASKS", None)
        layout.pop("SLURM_NPROCS", None)
        unset += ["SLURM_NTASKS", "SLURM_NPROCS"]  # the holding step's own (1) would be srun's -n
    for name in [k for k in env if k.startswith(("SLURM_", "SLURMD_"))]:
        del env[name]
    shims = env.pop("CORRAL_SLURM_SHIMS", None)
    if shims:  # Slurm's own srun, through corral's where a line gives Pyxis's options (``node.slurmstep``)
        env["CORRAL_SLURM_SHIMS"] = os.path.join(shims, "slurm")
    if hosts:
        layout["SLURM_JOB_NODELIST"] = layout["SLURM_NODELIST"] = hostlist(hosts)
        layout["SLURM_JOB_CPUS_PER_NODE"] = compressed_counts([cpus.get(h, 1) for h in hosts])
    layout["SLURM_OVERLAP"] = "1"
    return ["env"] + [a for name in unset for a in ("-u", name)] + [f"{k}={v}" for k, v in sorted(layout.items())]


def step_layout(env: dict[str, str], host_of) -> list[str]:
    """A replica's Slurm variables (``corral.runtime.batchenv.task_layout``; ``env`` is changed
    in place), as the ``env`` command that starts it inside its step: its rank among the
    task's replicas, their nodes and the job's (named as Slurm names them, ``host_of(node)``),
    its array; set over the step's own, which describe that step alone (one node, one task).
    Who and where the job is (its id, the step's id, the GPUs bound) stay Slurm's."""
    keep = TASK_LAYOUT | set(ARRAY_EXTENT) | {"SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"}
    layout = {k: env.pop(k) for k in list(env) if k in keep}
    for name in [k for k in env if k.startswith(("SLURM_", "SLURMD_"))]:
        del env[name]
    rename_nodes(layout, host_of)
    return ["env"] + [f"{k}={v}" for k, v in sorted(layout.items())]


def user_umask() -> int:
    """The umask replicas create files with: the one the server was started with (it keeps a
    private one for itself, ``corral.server``), 022 if unknown."""
    try:
        return int(os.environ.get("CORRAL_USER_UMASK", "0o022"), 8)
    except ValueError:
        return 0o022
