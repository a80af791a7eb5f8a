"""A corral job as one Slurm job: the allocation a job group in an ``infra: slurm``
partition asks Slurm for, sized to its gang.

Heterogeneous tasks map onto **one node shape**: the gang's replicas are packed onto as few
nodes of the Slurm partition's shape as they fit (first fit, largest first), and Slurm is
asked for that many nodes, each with the largest share any packed node needs (GPUs, CPUs,
memory). corral then places the replicas inside the allocation with its own scheduler. A
Slurm heterogeneous job would fit each task's shape more tightly, but Slurm 22.05 starts
those only from its backfill loop (every 30 s by default) and requires each component on a
different node, which a group of small tasks cannot meet; one shape starts at once.

The allocation's batch script only holds it (``sleep``); corral starts every replica as a
job step (``srun``). The job's partition (the corral partition's ``slurm_partition``),
account and QOS (when the job names them), time limit (rounded up to whole minutes) and a
signal before the limit (``--signal=TERM@grace``: Slurm sends it to every step, so replicas
get their grace period) are passed to Slurm; ``--requeue`` lets Slurm requeue it on
preemption or node failure, and corral then requeues the job under the same id."""

from __future__ import annotations

import math
from dataclasses import dataclass

NAME_PREFIX = "corral-"


@dataclass(frozen=True)
class Replica:
    gpus: int
    cpus: float
    memory: float  # GB
    alone: bool = False  # shares its node with no other ``alone`` replica (sbatch --nodes=N)


@dataclass(frozen=True)
class Shape:
    """What each node of the allocation holds, and how many nodes."""

    nodes: int
    gpus: int
    cpus: int
    memory_mb: int


@dataclass(frozen=True)
class NodeKind:
    """The Slurm partition's node shape (the smallest of its nodes, so any node fits)."""

    gpus: int
    cpus: int
    memory_mb: int
    gpu_type: str | None = None
    gpu_types: tuple[str, ...] = ()  # every GPU type some node of the partition has
    port_spaces: int = 0  # how many distinct addresses (port spaces) its nodes have (0: not known)


def pack(replicas: list[Replica], node: NodeKind) -> Shape:
    """First fit decreasing onto nodes of ``node``'s shape; raises ValueError for a replica
    no node of the partition can ever hold."""
    bins: list[list[float]] = []  # [gpus, cpus, memory MB] used per node
    # a job step holds whole CPUs: a replica asking for half a CPU takes one
    replicas = [Replica(r.gpus, max(1, math.ceil(r.cpus - 1e-9)), r.memory, r.alone) for r in replicas]
    taken: list[bool] = []  # whether a node holds an ``alone`` replica
    for r in sorted(replicas, key=lambda r: (-r.alone, -r.gpus, -r.cpus, -r.memory)):
        mem = r.memory * 1024
        if r.gpus > node.gpus or r.cpus > node.cpus or (node.memory_mb and mem > node.memory_mb):
            raise ValueError(f"a replica asking for {r.gpus} GPUs, {r.cpus:g} CPUs and {r.memory:g} GB does not fit a "
                             f"node of the Slurm partition ({node.gpus} GPUs, {node.cpus} CPUs, "
                             f"{node.memory_mb / 1024:g} GB)")
        for i, used in enumerate(bins):
            if (used[0] + r.gpus <= node.gpus and used[1] + r.cpus <= node.cpus
                    and (not node.memory_mb or used[2] + mem <= node.memory_mb) and not (r.alone and taken[i])):
                used[0] += r.gpus
                used[1] += r.cpus
                used[2] += mem
                taken[i] = taken[i] or r.alone
                break
        else:
            bins.append([r.gpus, r.cpus, mem])
            taken.append(r.alone)
    if not bins:
        raise ValueError("the job has no replicas")
    return Shape(len(bins), int(max(b[0] for b in bins)), max(1, math.ceil(max(b[1] for b in bins) - 1e-9)),
                 int(math.ceil(max(b[2] for b in bins))))


def job_name(scope: str, job_id: int) -> str:
    """The Slurm job name that ties an allocation to its corral job (found again by it after
    a server restart, so a job is never submitted twice)."""
    return f"{NAME_PREFIX}{scope}-{job_id}"


def job_of(name: str, scope: str) -> int | None:
    prefix = f"{NAME_PREFIX}{scope}-"
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def sbatch_args(shape: Shape, name: str, time_limit_s: float | None, grace_s: float, partition: str | None,
                account: str | None, qos: str | None, gpu_type: str | None, output: str,
                exclusive: bool = False, constraint: str | None = None) -> list[str]:
    argv = ["--exclusive"] if exclusive else []
    if constraint:
        argv.append(f"--constraint={constraint}")
    # NIL: the allocation's own script carries nothing of the server's environment (and Slurm
    # loads no login environment for it); each replica's step gets exactly its own (srun --export)
    argv += [f"--job-name={name}", f"--nodes={shape.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={shape.cpus}", "--requeue", f"--output={output}", "--open-mode=append", "--export=NIL"]
    if shape.gpus:
        argv.append(f"--gres=gpu:{gpu_type + ':' if gpu_type else ''}{shape.gpus}")
    if shape.memory_mb:
        argv.append(f"--mem={shape.memory_mb}M")
    if time_limit_s is not None and math.isfinite(time_limit_s):
        # corral's own limit ends the job first (signal, grace); Slurm's is the backstop
        argv.append(f"--time={max(1, math.ceil((time_limit_s + grace_s) / 60) + 1)}")
    argv.append(f"--signal=TERM@{max(1, min(int(grace_s) or 1, 65535))}")
    if partition:
        argv.append(f"--partition={partition}")
    if account:
        argv.append(f"--account={account}")
    if qos:
        argv.append(f"--qos={qos}")
    return argv


HOLD_SCRIPT = """#!/bin/bash
# The allocation of a corral job: corral starts its replicas as job steps (srun) and ends
# this job when the corral job ends (SIGUSR1: it completes; SIGUSR2: the corral job failed, so
# Slurm's accounting says FAILED). Nothing runs here but this wait. The wait's sleep is ended
# with it, or it would outlive the job on the node.
sleep infinity &
trap 'kill $! 2>/dev/null; exit 0' USR1
trap 'kill $! 2>/dev/null; exit 1' USR2
trap 'kill $! 2>/dev/null; exit 143' TERM
wait
"""
