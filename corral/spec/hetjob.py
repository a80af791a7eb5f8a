"""Heterogeneous Slurm batch jobs as corral job groups: ``#SBATCH hetjob`` (or its older
spelling ``packjob``) lines, or `` : `` on ``corral sbatch``'s command line, split a script's
options into components, each with its own node count, tasks, CPUs, GPUs, memory and node
choice (``--constraint``, ``--nodelist``, ``--exclusive``).

Each component becomes tasks of one corral job group, so the whole job is gang-scheduled as
Slurm schedules a heterogeneous job (all components at once), shows as one job in the queue
and is cancelled as one:

- component 0: the primary task ``het0`` (one replica, runs the script on the component's
  first node, as sbatch runs it) and, for more nodes, ``het0-node`` holding the others;
- component k: a task holding its nodes, named after the component's own ``-J`` when it gives
  one that no other task has, else ``het{k}``;
- every replica on a node of its own (``distinct_nodes``), as Slurm places components.

The components' layout travels in the batch task's step (``BatchStep.het``): the runtime
gives the script Slurm's ``*_HET_GROUP_k`` variables (``corral.runtime.batchenv``) and corral's
``srun --het-group`` runs steps on a component's nodes (``corral.node.srun``).

corral queues a job in one partition under one account, QOS, time limit and dependency: the
options of the job as a whole (all but those of ``PER_COMPONENT``) are the first component's
(as Slurm propagates most of them); a later component giving one with another value is an
error naming its line. ``--array`` is refused, as Slurm refuses it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.spec.batchshell import HOLD, runner
from corral.spec.loader import SpecIssue
from corral.spec.models import NAME_RE

SEPARATORS = ("hetjob", "packjob")
# what each component asks for itself; every other option is the job's as a whole
PER_COMPONENT = frozenset({"job-name", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "cpus-per-gpu", "gres",
                           "gpus", "gpus-per-node", "gpus-per-task", "mem", "mem-per-cpu", "constraint", "nodelist",
                           "exclusive"})


@dataclass
class Component:
    given: dict[str, Any]  # option -> sbatch._Given
    line: int | None  # its ``#SBATCH hetjob`` line (None: the first component, or the command line's)


Lines = list[tuple[int, list[str]]]  # directive lines: (line number, words)


def split(lines: Lines, issues: list[SpecIssue]) -> list[tuple[Component, Lines]]:
    """A script's components (no options read yet) and the directive lines of each: a
    ``#SBATCH hetjob`` line starts the next."""
    parts: list[tuple[Component, Lines]] = [(Component({}, None), [])]
    for line, words in lines:
        if words and words[0] in SEPARATORS:
            if len(words) > 1:
                issues.append(SpecIssue("sbatch script", words[0], line,
                                        f"stands alone on its line: give the next component's options on the "
                                        f"following #SBATCH lines, not {' '.join(words[1:])!r}"))
            parts.append((Component({}, line), []))
            continue
        parts[-1][1].append((line, words))
    return parts


def _where(given: dict[str, Any], name: str) -> str:
    line = given[name].line
    return f"line {line}" if line else "the command line"


def check_job_wide(components: list[Component], issues: list[SpecIssue]) -> None:
    """The job's own options are the first component's; ``--array`` is no option of a
    heterogeneous job."""
    first = components[0].given
    for index, component in enumerate(components):
        for name, given in component.given.items():
            document = "sbatch script" if given.line else "command line"
            if name == "array":
                issues.append(SpecIssue(document, "--array", given.line,
                                        "a heterogeneous job cannot be a job array (Slurm refuses it too)"))
            elif index and name not in PER_COMPONENT:
                if name not in first:
                    issues.append(SpecIssue(document, f"--{name}", given.line,
                                            f"applies to the whole heterogeneous job on corral (component {index} "
                                            "cannot have its own): give it in the first component"))
                elif first[name].value != given.value:
                    issues.append(SpecIssue(document, f"--{name}", given.line,
                                            f"differs from the first component's ({_where(first, name)}): corral "
                                            f"queues a heterogeneous job as one job, with one --{name}"))


def task_names(components: list[Component], job_name: str) -> list[str]:
    """Component 0 is ``het0``; component k is named after its own ``-J`` where that is a
    name no other task has, else ``het{k}``."""
    names = ["het0"]
    taken = {"het0", "het0-node"} | {f"het{k}" for k in range(len(components))}
    for index, component in enumerate(components[1:], start=1):
        own = component.given.get("job-name")
        name = own.value if own is not None else None
        if name and name != job_name and name not in taken and NAME_RE.fullmatch(name):
            taken.add(name)
            names.append(name)
        else:
            names.append(f"het{index}")
    return names


def het_job(text: str, components: list[Component], source: str, submit_dir: str, args: tuple[str, ...],
            environ: Mapping[str, str], issues: list[SpecIssue], notes: list[str]):
    """The job group of a heterogeneous batch script (see the module's docstring), its
    components checked by ``check_job_wide``."""
    from corral.spec.sbatch import BatchJob, _problems, job_level, shape_of

    first = components[0].given
    job = job_level(first, _problems(first, issues), notes, source, submit_dir, args, environ)
    shapes = [shape_of(c.given, _problems(c.given, issues), notes) for c in components]
    names = task_names(components, job.name)
    groups = []
    for index, (component, shape, name) in enumerate(zip(components, shapes, names)):
        own = component.given.get("job-name")
        tasks = [name] + ([f"{name}-node"] if index == 0 and shape.nodes > 1 else [])
        groups.append({**shape.step, "name": name, "tasks": tasks,
                       "job_name": own.value if own is not None and index else job.name})
    documents: list[dict[str, Any]] = [{"name": job.name, "execution": "parallel", "primary_tasks": ["het0"],
                                        "termination_delay": 0}]
    for index, (shape, group) in enumerate(zip(shapes, groups)):
        step = {**shape.step, **job.step, "het_group": index}
        if index == 0:
            batch = {"name": "het0", "run": runner(text, args), "envs": job.envs, "workdir": job.workdir,
                     "distinct_nodes": True, **shape.common, "sbatch": {**step, "role": "batch", "het": groups}}
            if job.warning is not None:
                batch["signal_before_timeout"] = job.warning
            documents.append(batch)
        holders = shape.nodes - 1 if index == 0 else shape.nodes
        if holders:
            documents.append({"name": group["tasks"][-1], "num_nodes": holders, "run": HOLD, "workdir": job.workdir,
                              "distinct_nodes": True, **shape.common, "sbatch": {**step, "role": "node"}})
    return BatchJob(documents, job.scheduling, None, notes, wait=job.wait, parsable=job.parsable,
                    base_dir=submit_dir, export=job.export)
