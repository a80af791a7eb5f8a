"""What a task needs to run a Slurm batch script, beside where its replicas may go.

Node choice fields (on the task itself) narrow where its replicas go: ``constraint``
(node features, ``sbatch --constraint``, read by ``corral.scheduler.features``), ``nodelist``
(only these nodes), ``exclusive`` (a replica takes its whole node) and ``distinct_nodes`` (no
two such replicas of the job share a node, as ``sbatch --nodes=N`` asks for N nodes).

``BatchStep`` is what the runtime needs to give a batch script Slurm's environment and the
``srun``/``scontrol`` commands: the job's task layout, output files and signal routing. It
is produced by ``corral.spec.sbatch`` and read at launch by ``corral.runtime.batchenv``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from corral.spec.base import Strict as _Strict
from corral.spec.service import SignalName

class HetGroup(_Strict):
    """One component of a heterogeneous batch job (``corral.spec.hetjob``): the tasks holding its
    nodes (its first node's first) and its layout."""

    name: str
    tasks: tuple[str, ...]
    job_name: str  # SLURM_JOB_NAME_HET_GROUP_k: the component's own -J, else the job's
    nodes: int = Field(ge=1, le=4096)
    ntasks: int = Field(ge=1, le=1_000_000)
    ntasks_per_node: int | None = Field(default=None, ge=1)
    ntasks_given: bool = True
    cpus_per_task: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    gpus_per_task: int | None = Field(default=None, ge=0)


class BatchStep(_Strict):
    role: Literal["batch", "node"]  # the replica running the script, or one holding another node
    nodes: int = Field(ge=1, le=4096)
    ntasks: int = Field(ge=1, le=1_000_000)
    ntasks_per_node: int | None = Field(default=None, ge=1)
    ntasks_given: bool = True  # -n or --ntasks-per-node was given (sbatch sets SLURM_NTASKS only then)
    cpus_per_task: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    gpus_per_task: int | None = Field(default=None, ge=0)
    output: str | None = None  # sbatch's --output pattern (%j %x %A %a %N %t %u %%)
    error: str | None = None
    submit_dir: str = "/"
    slurm_name: str = ""  # SLURM_JOB_NAME, %x: -J as written, else the script's file name ("": the job's name)
    # --signal=B:SIG reaches only the batch shell; without B: only the steps (srun's tasks)
    signal_batch_only: bool = True
    warn_signal: SignalName | None = None
    export_none: bool = False  # --export=NONE: the script starts without the submitter's variables
    args: tuple[str, ...] = ()  # the script's own arguments
    # the script's own container (#SBATCH --container-image …): ``corral.spec.pyxis.StepContainer``
    container: dict[str, Any] | None = None
    # a heterogeneous job (#SBATCH hetjob): the component of this task, and (on the batch task)
    # every component's layout, component 0 first
    het_group: int | None = Field(default=None, ge=0)
    het: tuple[HetGroup, ...] = ()

    @field_validator("output", "error")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None and ("\x00" in value or not value.strip()):
            raise ValueError("an output pattern is a non-empty path")
        return value
