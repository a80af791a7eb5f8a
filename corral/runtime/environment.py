"""The environment a replica sees, built here and nowhere else: the basics of a login, the
submitter's variables its export mode selected (``corral.spec.world``: Slurm's ``--export``
rule), the job's own ``envs`` and ``secrets``, and corral's variables — its own, the SkyPilot
and Slurm names existing scripts already read, the rank-0 rendezvous of its task (of its
gang, for a multi-node service replica: ``gang_view``), its GPUs.

Never the server's environment (nor a Ray worker's, nor slurmd's): executors start replicas
with exactly this mapping, so a job behaves the same wherever it runs and whoever started
the server."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass, replace
from typing import Any

from corral.runtime.batchenv import array_extent, task_layout

# A login shell's PATH where the submitter's is not carried (--export=NONE, or a list
# without PATH), as /etc/login.defs gives one.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_basics(user: str) -> dict[str, str]:
    """What every replica has before the submitter's variables: a PATH, and who and where its
    user is (HOME and SHELL from the account of that name on this machine, when there is one)."""
    env = {"PATH": LOGIN_PATH, "USER": user, "LOGNAME": user}
    try:
        entry = pwd.getpwnam(user)
    except (KeyError, TypeError):
        return env
    env["HOME"] = entry.pw_dir
    env["SHELL"] = entry.pw_shell or "/bin/sh"
    return env


def starting_environment(world: dict[str, Any] | None, user: str) -> dict[str, str]:
    """The environment a replica starts from, before the job's ``envs`` and corral's
    variables: the basics of a login, then what the job's export mode carried of the
    submitter's (a job stored without a world, submitted before corral kept one, gets the
    basics alone). Who the replica is (USER, LOGNAME, HOME, SHELL) is its account's, never
    the submitting shell's: a token's user may submit from a shell of another account."""
    env = login_basics(user)
    who = {k: env[k] for k in ("USER", "LOGNAME", "HOME", "SHELL") if k in env}
    env.update((world or {}).get("environment") or {})
    env.update(who)
    return env


def join_paths(first: str, then: str | None) -> str:
    """``first`` ahead of a colon-separated path that may be unset or empty."""
    return first + (os.pathsep + then if then else "")



@dataclass(frozen=True)
class ReplicaContext:
    job_id: int
    job_name: str
    is_group: bool
    task: str
    rank: int
    num_replicas: int
    node: str
    node_ips: tuple[str, ...]  # one per replica of the task, by rank
    addr: str
    gpus: tuple[int, ...]
    gpus_per_replica: int
    cpus: float
    master_port: int
    checkpoint_dir: str
    restart_count: int
    user: str
    task_envs: tuple[tuple[str, str], ...] = ()
    master_addr: str = ""  # the address of the task's rank 0 (its node's IP beyond this machine)
    task_nodes: tuple[str, ...] = ()  # the node of each replica of the task, by rank ("" if not placed)
    job_nodes: tuple[str, ...] = ()  # the nodes of the job's replicas
    array_job_id: int | None = None  # an element of a job array: the array's id, its index and extent
    array_index: int | None = None
    array_extent: tuple[int, ...] | None = None
    # replicas in gangs of this many (a multi-node service replica): ranks, IPs, MASTER_ADDR
    # and the world are the gang's own; node_ips and task_nodes still list the whole task
    gang_size: int = 1
    domain: str = ""  # that of its name, ``{task}-{rank}.{domain}`` ("": the job's name; ``discovery``)


def gang_view(ctx: ReplicaContext) -> ReplicaContext:
    """The context as the replica's gang sees it: its rank within the gang, the gang's IPs and
    nodes only, the gang's rank 0 as MASTER_ADDR. Its name (``CORRAL_HOSTNAME``) stays the
    task-wide ``{task}-{rank}``, so every name a job had stays valid, and corral's own
    ``CORRAL_REPLICA``, ``CORRAL_NUM_REPLICAS`` and ``CORRAL_NODE_IPS`` stay the task's; the
    names frameworks read (``SKYPILOT_*``, ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``SLURM_PROCID`` …) are the gang's, as inside one SkyServe replica."""
    size = ctx.gang_size
    if size <= 1:
        return ctx
    first = (ctx.rank // size) * size
    ips = ctx.node_ips[first:first + size]
    nodes = ctx.task_nodes[first:first + size] if len(ctx.task_nodes) == ctx.num_replicas else ()
    return replace(ctx, rank=ctx.rank - first, num_replicas=size, node_ips=ips, task_nodes=nodes,
                   master_addr=ips[0] if ips else ctx.addr,
                   job_nodes=tuple(dict.fromkeys(n for n in nodes if n)) or ctx.job_nodes)


def replica_env(base: dict[str, str], task_ctx: ReplicaContext) -> dict[str, str]:
    domain = task_ctx.domain or task_ctx.job_name  # the job keeps its name; its replicas' names may not
    hostname = f"{task_ctx.task}-{task_ctx.rank}.{domain}"
    ctx = gang_view(task_ctx)
    node_ips = "\n".join(ctx.node_ips)
    gpu_list = ",".join(str(g) for g in ctx.gpus)
    env = dict(base)
    env.update({
        "CORRAL_JOB_ID": str(ctx.job_id),
        "CORRAL_JOB_NAME": ctx.job_name,
        "CORRAL_TASK": ctx.task,
        "CORRAL_REPLICA": str(task_ctx.rank),  # its name's rank: task-wide
        "CORRAL_NUM_REPLICAS": str(task_ctx.num_replicas),
        "CORRAL_NODE_IPS": "\n".join(task_ctx.node_ips),
        "CORRAL_HOSTNAME": hostname,
        "CORRAL_JOB_DOMAIN": domain,
        "CORRAL_ADDR": ctx.addr,
        "CORRAL_NODE": ctx.node,
        "CORRAL_CHECKPOINT_DIR": ctx.checkpoint_dir,
        "CORRAL_RESTART_COUNT": str(ctx.restart_count),
        "CORRAL_USER": ctx.user,
        "MASTER_ADDR": ctx.master_addr or (ctx.node_ips[0] if ctx.node_ips else ctx.addr),
        "MASTER_PORT": str(ctx.master_port),
        "WORLD_SIZE": str(ctx.num_replicas),
        "RANK": str(ctx.rank),
        # An empty CUDA_VISIBLE_DEVICES hides every GPU, which is what a GPU-less replica needs.
        "CUDA_VISIBLE_DEVICES": gpu_list,
        "SKYPILOT_NODE_RANK": str(ctx.rank),
        "SKYPILOT_NODE_IPS": node_ips,
        "SKYPILOT_NUM_NODES": str(ctx.num_replicas),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(ctx.gpus_per_replica),
        "SKYPILOT_TASK_ID": f"corral-{ctx.job_id}-{ctx.task}",
        "SKYPILOT_JOB_ID": str(ctx.job_id),
        "SKYPILOT_ROOT_JOB_ID": str(ctx.job_id),
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": ctx.job_name, "num_nodes": ctx.num_replicas,
                                             "provider_name": "corral-local"}),
        "SLURM_JOB_ID": str(ctx.job_id),
        "SLURM_JOB_NAME": ctx.job_name,
        "SLURMD_NODENAME": ctx.node,
        "SLURM_RESTART_COUNT": str(ctx.restart_count),
        "SLURM_JOB_GPUS": gpu_list,
        "SLURM_CPUS_PER_TASK": str(max(1, int(ctx.cpus))),
    })
    # the task is a step and each replica one of its tasks (corral.runtime.batchenv.task_layout)
    nodes = ctx.task_nodes if len(ctx.task_nodes) == ctx.num_replicas else \
        tuple(ctx.node if i == ctx.rank else "" for i in range(ctx.num_replicas))
    env.update(task_layout(ctx.rank, nodes, ctx.job_nodes))
    if ctx.array_job_id is not None and ctx.array_index is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(ctx.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(ctx.array_index)
        env.update(array_extent(ctx.array_extent))
    if task_ctx.gang_size > 1:
        gang = task_ctx.rank // task_ctx.gang_size
        env.update({"CORRAL_GANG": str(gang), "CORRAL_GANG_RANK": str(ctx.rank),
                    "CORRAL_GANG_SIZE": str(task_ctx.gang_size),
                    "CORRAL_GANG_HEAD": f"{task_ctx.task}-{gang * task_ctx.gang_size}.{domain}"})
    if ctx.is_group:
        env["CORRAL_JOBGROUP_NAME"] = ctx.job_name
        env["SKYPILOT_JOBGROUP_NAME"] = ctx.job_name
    env.update(dict(ctx.task_envs))
    return env
