"""The node pool: nodes declared in ``config.yaml`` (``nodes:``, read by ``corral.site``),
or else this one machine with its real CPUs, memory and the GPUs ``nvidia-smi`` reports.
Virtual nodes let tests and laptops declare GPUs that do not exist; the same code binds real
ones by index."""

from __future__ import annotations

import shutil
import socket
import subprocess
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.scheduler.snapshot import NodeView
from corral.spec.loader import SpecError, SpecIssue
from corral.spec.models import NAME_RE
from corral.spec.source import Document


class _Node(BaseModel):
    """A node's name, resources and labels: what ``config.yaml`` may declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    gpus: int = Field(default=0, ge=0, le=1024)
    gpu_type: str | None = None
    cpus: float = Field(default=1.0, gt=0)
    memory: float = Field(default=1.0, ge=0, description="GB")
    labels: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError("a node name uses letters, digits, '-' and '_'")
        return value


class NodeSpec(_Node):
    """One node as the scheduler sees it."""

    # the job this node belongs to alone: an engine provisioned it for that job (never declared)
    dedicated_to: int | None = None
    # the address its replicas listen on when they share one (a Ray or Slurm node's IP): their
    # declared ports are then a resource of that address; None: each replica has its own
    address: str | None = None


class NodeEntry(_Node):
    """A ``nodes:`` entry; ``count`` declares ``name-0 … name-{count-1}``."""

    count: int | None = Field(default=None, ge=1, le=10_000)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


def node_views(nodes: list[NodeSpec]) -> tuple[NodeView, ...]:
    """The pool as the scheduler reads it."""
    return tuple(NodeView(n.name, n.gpus, n.cpus, n.memory, n.gpu_type, tuple(sorted(n.labels.items())),
                          dedicated_to=n.dedicated_to, address=n.address) for n in nodes)


def expand_nodes(entries: list[NodeEntry], doc: Document, source: str) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    for entry in entries:
        base = entry.model_dump(exclude={"count"})
        if entry.count is None:
            nodes.append(NodeSpec(**base))
        else:
            nodes.extend(NodeSpec(**{**base, "name": f"{entry.name}-{i}"}) for i in range(entry.count))
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecError([SpecIssue("config", "nodes", doc.line_of(("nodes",)),
                                   f"node names must be unique; repeated: {', '.join(dupes)}")], source)
    return nodes


def local_machine() -> NodeSpec:
    gpus, gpu_type = _nvidia_gpus()
    return NodeSpec(name=_hostname(), gpus=gpus, gpu_type=gpu_type, cpus=float(psutil.cpu_count() or 1),
                    memory=round(psutil.virtual_memory().total / 2**30, 1))


def _hostname() -> str:
    name = socket.gethostname().split(".")[0]
    return name if NAME_RE.fullmatch(name) else "localhost"


def _nvidia_gpus() -> tuple[int, str | None]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0, None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    if not names:
        return 0, None
    # "NVIDIA H100 80GB HBM3" -> "H100", the form users write in accelerators
    words = [w for w in names[0].replace("NVIDIA", "").split() if any(c.isdigit() for c in w)]
    return len(names), (words[0] if words else names[0].split()[-1])
