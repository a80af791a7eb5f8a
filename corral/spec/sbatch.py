"""Slurm batch scripts as corral jobs: ``corral launch train.sbatch`` and ``corral sbatch
[options] SCRIPT [ARGS]``.

A file is a batch script when its first line is a ``#!`` line and it has ``#SBATCH`` lines
before its first command (sbatch stops reading directives there too). Directives and
command-line options go through one option table (``OPTIONS``): long and short forms,
``--opt=value`` and ``--opt value``; command-line options override the script's, as in
sbatch. An option with no meaning on corral is named in a warning; an unknown option or a
malformed value is an error naming the option and its line, and nothing is submitted. The
options' values are read by ``corral.spec.sbatchvalues``.

The result maps onto corral's own job model so the queue, fair share, partitions, QOS, time
limits, signals, requeue, dependencies and node constraints of corral apply:

- one node: a plain job of one task that runs the script;
- ``--nodes=N`` (N > 1): a job group of a primary task ``batch`` (one replica, runs the
  script, on the first node) and an auxiliary task ``node`` (N-1 replicas that hold the
  other nodes until the script ends; termination delay 0), all on distinct nodes
  (``distinct_nodes``), each holding one node's share (``--gpus-per-node``, tasks per node ×
  ``--cpus-per-task`` CPUs, ``--mem``);
- ``#SBATCH hetjob`` components (or `` : `` on the command line): a job group with tasks per
  component (``corral.spec.hetjob``);
- the script's text travels inside the job (``corral.spec.batchshell``), so a requeued job
  runs the script it was submitted with;
- ``BatchStep`` (``corral.spec.batchstep``) carries what the runtime needs for Slurm's
  variables and the ``srun``/``scontrol`` commands (``corral.runtime.batchenv``)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.spec.batchshell import HOLD, runner, shell_words
from corral.spec.jobarray import parse_array
from corral.spec.loader import SpecError, SpecIssue
from corral.spec.models import NAME_RE
from corral.spec import pyxis
from corral.spec.sbatchvalues import (_constraint, _count, _dependency, _export, _gpus, _gres, _name, _nice, _nodelist,
                                      _nodes, _pattern, _signal, _text, _yes_no, slurm_minutes, slurm_size_gb)

# -- the option table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    long: str
    short: str | None = None
    parse: Callable[[str], Any] | None = _text  # None: a flag
    default: str | None = None  # the value of an optional-argument option given bare
    ignored: str = ""  # why it has no meaning here (a warning); empty: it is used


_IGNORED = "has no meaning on corral's queue"
OPTIONS: tuple[Option, ...] = (
    Option("job-name", "J", _name),
    Option("nodes", "N", _nodes),
    Option("ntasks", "n", _count),
    Option("ntasks-per-node", None, _count),
    Option("cpus-per-task", "c", _count),
    Option("cpus-per-gpu", None, _count),
    Option("gres", None, _gres),
    Option("gpus", "G", _gpus),
    Option("gpus-per-node", None, _gpus),
    Option("gpus-per-task", None, _gpus),
    Option("mem", None, slurm_size_gb),
    Option("mem-per-cpu", None, slurm_size_gb),
    Option("time", "t", slurm_minutes),
    Option("partition", "p", _text),
    Option("account", "A", _text),
    Option("qos", "q", _text),
    Option("output", "o", _pattern),
    Option("error", "e", _pattern),
    Option("exclusive", None, _text, default="exclusive"),
    Option("array", "a", parse_array),
    Option("dependency", "d", _dependency),
    Option("kill-on-invalid-dep", None, _yes_no),
    Option("signal", None, _signal),
    Option("requeue", None, None),
    Option("no-requeue", None, None),
    Option("constraint", "C", _constraint),
    Option("nodelist", "w", _nodelist),
    Option("chdir", "D", _text),
    Option("export", None, _export),
    Option("hold", "H", None),
    Option("nice", None, _nice, default="100"),
    Option("wait", "W", None),
    Option("parsable", None, None),
    Option("wrap", None, _text),  # the command line's own: the command becomes the script (corral.cli.batch)
    # Pyxis's options as directives: the batch script runs in that container (``corral.spec.pyxis``)
    *(Option(name, None, _text if takes else None) for name, takes in pyxis.OPTIONS.items()),
    # every corral job starts on all its nodes at once, which is what this asks of Slurm
    Option("wait-all-nodes", None, _text, ignored="is how corral always starts a job (all its nodes at once)"),
    # accepted with a warning naming them: they change nothing a corral job could honour
    *(Option(name, short, _text, ignored=_IGNORED) for name, short in (
        ("mail-type", None), ("mail-user", None), ("hint", None), ("reservation", None), ("comment", None),
        ("wckey", None), ("profile", None), ("acctg-freq", None), ("distribution", "m"), ("cpu-freq", None),
        ("gpu-bind", None), ("gpu-freq", None), ("mem-bind", None), ("licenses", "L"), ("open-mode", None),
        ("network", None), ("switches", None), ("tmp", None), ("threads-per-core", None), ("propagate", None),
        ("sockets-per-node", None), ("cores-per-socket", None), ("mcs-label", None), ("power", None))),
    *(Option(name, short, None, ignored=_IGNORED) for name, short in (
        ("overcommit", "O"), ("oversubscribe", "s"), ("spread-job", None), ("quiet", "Q"), ("verbose", "v"),
        ("no-kill", "k"), ("get-user-env", None), ("use-min-nodes", None))),
)
_BY_LONG = {o.long: o for o in OPTIONS}
_BY_SHORT = {o.short: o for o in OPTIONS if o.short}


@dataclass
class _Given:
    value: Any
    line: int | None  # None: the command line
    written: str | None = None  # the value as written (-J's, before it became a host name)


@dataclass
class BatchJob:
    """A batch script as a corral submission: the job's YAML documents, its job-level
    scheduling fields, its array (if any), and warnings to show."""

    documents: list[dict[str, Any]]
    scheduling: dict[str, Any]
    array: str | None = None
    warnings: list[str] = field(default_factory=list)
    wait: bool = False  # sbatch --wait: block until the job ends
    parsable: bool = False
    base_dir: str = "/"
    export: str | None = None  # --export as given (normalised); None: the site's default (Slurm's: ALL)


def is_batch_script(text: str) -> bool:
    """A ``#!`` first line, then ``#SBATCH`` before the first command (comments and blank lines
    aside), as sbatch reads its directives."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!"):
        return False
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            return True
        if stripped and not stripped.startswith("#"):
            return False
    return False


def directives(text: str) -> list[tuple[int, list[str]]]:
    """The words of each ``#SBATCH`` line before the first command, with its line number."""
    out = []
    for number, line in enumerate(text.splitlines()[1:], start=2):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            rest = stripped[len("#SBATCH"):]
            if rest and not rest[0].isspace():
                continue  # "#SBATCHX" is a comment to sbatch too
            try:
                out.append((number, shell_words(rest)))
            except ValueError as exc:
                out.append((number, [f"\0{exc}"]))
        elif stripped and not stripped.startswith("#"):
            break
    return out


def _read(words: list[str], line: int | None, given: dict[str, _Given], issues: list[SpecIssue],
          warnings: list[str], stop_at_operand: bool = False) -> int:
    """Read options into ``given``; returns how many words were options (the command line
    stops at the script's path)."""
    where = "sbatch script" if line is not None else "command line"
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("\0"):
            issues.append(SpecIssue(where, "", line, f"cannot split the line into words: {word[1:]}"))
            return len(words)
        if not word.startswith("-") or word == "-":
            if stop_at_operand:
                return i
            issues.append(SpecIssue(where, word, line, "is not an option (directives are --name=value or -x value)"))
            i += 1
            continue
        if word == "--":
            return i + 1
        value: str | None
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            option = _BY_LONG.get(name)
            label = f"--{name}"
            value = value if sep else None
        else:
            option = _BY_SHORT.get(word[1:2])
            label = word[:2]
            value = word[2:] or None
            if value is not None and value.startswith("="):
                value = value[1:]
        if option is None:
            issues.append(SpecIssue(where, label, line, "unknown sbatch option"))
            i += 1
            continue
        if option.parse is None:  # a flag
            if value is not None:
                issues.append(SpecIssue(where, label, line, "takes no value"))
        elif value is None:
            if option.default is not None:
                value = option.default
            elif i + 1 < len(words):
                i += 1
                value = words[i]
            else:
                issues.append(SpecIssue(where, label, line, "needs a value"))
                i += 1
                continue
        i += 1
        if option.ignored:
            warnings.append(f"{label}{'=' + value if value else ''} (line {line}) {option.ignored}; ignored"
                            if line is not None else f"{label} {option.ignored}; ignored")
            continue
        try:
            parsed = True if option.parse is None else option.parse(value)
        except ValueError as exc:
            issues.append(SpecIssue(where, label, line, str(exc)))
            continue
        if option.long == "job-name" and parsed != value:
            warnings.append(f"{label} {value!r}{f' (line {line})' if line is not None else ''} runs as {parsed!r}: "
                            "a job's name is part of its replicas' host names")
        if option.long in ("requeue", "no-requeue"):
            given.pop("requeue", None)
            given["requeue"] = _Given(option.long == "requeue", line)
            continue
        given[option.long] = _Given(parsed, line, value)
    return len(words)


def command_line_components(words: list[str]) -> tuple[list[dict[str, _Given]], list[str], list[SpecIssue],
                                                         list[str]]:
    """``corral sbatch`` arguments: (options of each component, [SCRIPT, ARGS…], problems,
    warnings); a lone ``:`` separates the components of a heterogeneous job, as in sbatch."""
    components: list[dict[str, _Given]] = [{}]
    issues: list[SpecIssue] = []
    warnings: list[str] = []
    at = 0
    while True:
        at += _read(words[at:], None, components[-1], issues, warnings, stop_at_operand=True)
        if at < len(words) and words[at] == ":":
            components.append({})
            at += 1
            continue
        return components, words[at:], issues, warnings


def parse_command_line(words: list[str]) -> tuple[dict[str, _Given], list[str], list[SpecIssue], list[str]]:
    """``corral sbatch`` arguments of a job of one component: (options, [SCRIPT, ARGS…],
    problems, warnings)."""
    components, rest, issues, warnings = command_line_components(words)
    if len(components) > 1:
        issues.append(SpecIssue("command line", ":", None, "components of a heterogeneous job (' : ') are given "
                                "to corral sbatch only"))
    return components[0], rest, issues, warnings


def load_batch(text: str, *, source: str = "<script>", submit_dir: str = "/", args: tuple[str, ...] = (),
               overrides: dict[str, _Given] | list[dict[str, _Given]] | None = None,
               environ: Mapping[str, str] | None = None, warnings: list[str] | None = None) -> BatchJob:
    """The script's directives, overridden by ``overrides`` (the command line's; one dict per
    component of a heterogeneous job), as a corral submission. ``environ`` is the submitter's
    environment (for ``--export=VAR``)."""
    from corral.spec import hetjob

    issues: list[SpecIssue] = []
    notes: list[str] = list(warnings or [])
    if "\x00" in text:
        raise SpecError([SpecIssue("sbatch script", "", None, "holds a NUL byte")], source)
    components = []
    for component, lines in hetjob.split(directives(text), issues):
        for line, words in lines:
            _read(words, line, component.given, issues, notes)
        if "wrap" in component.given:  # as sbatch: the command line's, where there is no script yet
            issues.append(SpecIssue("sbatch script", "--wrap", component.given.pop("wrap").line,
                                    "is an option of the command line, where it gives the command instead of a script"))
        components.append(component)
    for index, given in enumerate([overrides] if isinstance(overrides, dict) else overrides or []):
        if index == len(components):
            components.append(hetjob.Component({}, None))
        components[index].given.update(given)
    for line, found in pyxis.script_steps(text):  # srun lines' container options, read now
        if isinstance(found, pyxis.PyxisError):
            issues.append(SpecIssue("srun line", found.option, line, found.message))
        elif "container-image" in components[0].given:
            notes.append(f"line {line}: srun runs inside the batch script's container (--container-image), where, "
                         "as with Pyxis, srun is not available")
    if len(components) > 1:
        hetjob.check_job_wide(components, issues)
    if issues:
        raise SpecError(issues, source)
    if len(components) > 1:
        job = hetjob.het_job(text, components, source, submit_dir, args, environ or {}, issues, notes)
    else:
        job = _to_job(text, components[0].given, source, submit_dir, args, environ or {}, issues, notes)
    if issues:
        raise SpecError(issues, source)
    return job


def _value(given: dict[str, _Given], name: str, default: Any = None) -> Any:
    return given[name].value if name in given else default


def _problems(given: dict[str, _Given], issues: list[SpecIssue]) -> Callable[[str, str], None]:
    def problem(name: str, message: str) -> None:
        issues.append(SpecIssue("sbatch script" if given[name].line else "command line", f"--{name}",
                                given[name].line, message))
    return problem


@dataclass
class Shape:
    """What one allocation (a job, or one component of a heterogeneous job) asks of each node."""

    nodes: int
    step: dict[str, Any]  # its part of ``BatchStep``: nodes, tasks, CPUs and GPUs per task and node
    common: dict[str, Any]  # its tasks' resources and node choice (constraint, nodelist, exclusive)


def shape_of(given: dict[str, _Given], problem: Callable[[str, str], None], notes: list[str]) -> Shape:
    nodes = _value(given, "nodes", 1)
    if "nodelist" in given and "nodes" not in given:
        nodes = len(given["nodelist"].value)
    if "nodelist" in given and len(given["nodelist"].value) > nodes:
        problem("nodelist", f"names {len(given['nodelist'].value)} nodes but the job asks for {nodes} (--nodes)")
    per_node = _value(given, "ntasks-per-node")
    ntasks = _value(given, "ntasks")
    if ntasks is None:
        ntasks = nodes * (per_node or 1)
    elif per_node is not None and per_node * nodes < ntasks:
        problem("ntasks", f"{ntasks} tasks do not fit {nodes} node(s) x {per_node} tasks per node")
    if ntasks < nodes:
        problem("ntasks", f"{ntasks} task(s) cannot cover {nodes} nodes (each node runs at least one)")
    tasks_per_node = per_node or math.ceil(ntasks / nodes)
    cpt = _value(given, "cpus-per-task", 1)

    gpu_type: str | None = None
    gpus_node = 0
    gpt = None
    sources = [n for n in ("gres", "gpus", "gpus-per-node", "gpus-per-task") if n in given]
    if set(sources) == {"gres", "gpus-per-node"}:
        (gres_type, gres_count), (node_type, node_count) = given["gres"].value, given["gpus-per-node"].value
        if gres_count == node_count and (None in (gres_type, node_type) or gres_type == node_type):
            sources = ["gpus-per-node"]  # the same GPUs said twice, as many scripts do: one request
            given = {**given, "gpus-per-node": _Given((gres_type or node_type, node_count), given["gpus-per-node"].line)}
    if len(sources) > 1 and not (set(sources) == {"gpus-per-task", "gpus"}):
        problem(sources[1], f"give the GPUs once: --{sources[0]} is given too")
    if "gres" in given:
        gpu_type, gpus_node = given["gres"].value
    if "gpus-per-node" in given:
        gpu_type, gpus_node = given["gpus-per-node"].value
    if "gpus" in given and "gpus-per-task" not in given:
        gpu_type, total = given["gpus"].value
        if total % nodes:
            problem("gpus", f"{total} GPUs do not split evenly over {nodes} nodes; use --gpus-per-node")
        gpus_node = total // nodes
    if "gpus-per-task" in given:
        gpu_type, gpt = given["gpus-per-task"].value
        gpus_node = gpt * tasks_per_node
    cpus_node = cpt * tasks_per_node
    if "cpus-per-gpu" in given:
        cpus_node = max(cpus_node, given["cpus-per-gpu"].value * gpus_node)
    memory = 0.0
    if "mem" in given and "mem-per-cpu" in given:
        problem("mem-per-cpu", "give --mem or --mem-per-cpu, not both")
    elif "mem" in given:
        memory = given["mem"].value
        if memory == 0:
            notes.append("--mem=0 asks for all of a node's memory: corral reserves none (use --exclusive for "
                         "whole nodes)")
    elif "mem-per-cpu" in given:
        memory = given["mem-per-cpu"].value * cpus_node
    step = {"nodes": nodes, "ntasks": ntasks, "cpus_per_task": cpt, "gpus_per_node": gpus_node,
            "ntasks_given": _value(given, "ntasks") is not None or per_node is not None}
    for key, value in (("ntasks_per_node", per_node), ("gpus_per_task", gpt)):
        if value is not None:
            step[key] = value
    resources: dict[str, Any] = {"cpus": cpus_node, "memory": round(memory, 6)}
    if gpus_node:
        resources["accelerators"] = f"{gpu_type}:{gpus_node}" if gpu_type else gpus_node
    common: dict[str, Any] = {"resources": resources}
    if "constraint" in given:
        common["constraint"] = given["constraint"].value
    if "nodelist" in given:
        common["nodelist"] = list(given["nodelist"].value)
    if "exclusive" in given:
        common["exclusive"] = True
    return Shape(nodes, step, {**common, "grace_period": "30s"})


@dataclass
class JobLevel:
    """What a batch script asks of the job as a whole (of its first component, in a
    heterogeneous job): its name, the script's environment and directory, its step fields
    (output files, signals, export), the queue's fields and the job's own flags."""

    name: str
    envs: dict[str, str]
    workdir: str
    step: dict[str, Any]
    scheduling: dict[str, Any]
    warning: dict[str, Any] | None  # signal_before_timeout
    array: str | None
    export: str | None
    wait: bool
    parsable: bool


def job_level(given: dict[str, _Given], problem: Callable[[str, str], None], notes: list[str], source: str,
              submit_dir: str, args: tuple[str, ...], environ: Mapping[str, str]) -> JobLevel:
    name = _value(given, "job-name") or _script_name(source)
    batch_only, warn_signal, warn_seconds = _value(given, "signal", (True, None, 0.0))
    export_none, exported = _value(given, "export", (False, ()))
    envs: dict[str, str] = {}
    for item in exported:
        key, sep, val = item.partition("=")
        if sep:
            envs[key] = val
        elif key in environ:
            envs[key] = environ[key]
        else:
            problem("export", f"{key} is not set in the submitting environment")
    chdir = _value(given, "chdir")
    if chdir is not None and not chdir.startswith("/"):
        chdir = f"{submit_dir.rstrip('/')}/{chdir}"
    container = _container(given, problem)
    # Slurm's name for it: -J as written, else the script's file name (sbatch's default)
    slurm_name = (given["job-name"].written if "job-name" in given else None) or source.rsplit("/", 1)[-1]
    step = {"submit_dir": submit_dir, "signal_batch_only": batch_only, "export_none": export_none, "args": list(args),
            "slurm_name": slurm_name[:1024]}
    for key, value in (("warn_signal", warn_signal), ("output", _value(given, "output")),
                       ("error", _value(given, "error")), ("container", container)):
        if value is not None:
            step[key] = value
    scheduling: dict[str, Any] = {}
    for option, key in (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                        ("dependency", "dependency"), ("nice", "nice"), ("kill-on-invalid-dep", "kill_on_invalid_dep"),
                        ("requeue", "requeue")):
        if option in given:
            scheduling[key] = given[option].value
    if "partition" in given and "," in scheduling["partition"]:
        first = scheduling["partition"].split(",")[0]
        notes.append(f"--partition={scheduling['partition']}: corral queues a job in one partition; using {first}")
        scheduling["partition"] = first
    if "hold" in given:
        scheduling["hold"] = True
    limit = _value(given, "time")
    if limit is not None:
        scheduling["time_limit"] = limit
    array = given["array"].value if "array" in given else None
    export = None
    if "export" in given:
        export = ",".join((["ALL"] if not export_none else [] if exported else ["NONE"]) + list(exported))
    warning = {"signal": warn_signal, "seconds": warn_seconds} if warn_signal is not None else None
    return JobLevel(name, envs, chdir or submit_dir, step, scheduling, warning,
                    str(array) if array is not None else None, export,
                    bool(_value(given, "wait", False)), bool(_value(given, "parsable", False)))


def _to_job(text: str, given: dict[str, _Given], source: str, submit_dir: str, args: tuple[str, ...],
            environ: Mapping[str, str], issues: list[SpecIssue], notes: list[str]) -> BatchJob:
    problem = _problems(given, issues)
    shape = shape_of(given, problem, notes)
    job = job_level(given, problem, notes, source, submit_dir, args, environ)
    step = {**shape.step, **job.step}
    common = dict(shape.common)
    if job.warning is not None:
        common["signal_before_timeout"] = job.warning
    batch_task = {"name": "batch" if shape.nodes > 1 else job.name, "run": runner(text, args), "envs": job.envs,
                  "workdir": job.workdir, **common, "sbatch": {**step, "role": "batch"}}
    if shape.nodes == 1:
        documents = [{**batch_task}]
    else:
        batch_task["distinct_nodes"] = True
        holder = {"name": "node", "num_nodes": shape.nodes - 1, "run": HOLD, "workdir": job.workdir,
                  "distinct_nodes": True, **common, "sbatch": {**step, "role": "node"}}
        holder.pop("signal_before_timeout", None)
        documents = [{"name": job.name, "execution": "parallel", "primary_tasks": ["batch"], "termination_delay": 0},
                     batch_task, holder]
    return BatchJob(documents, job.scheduling, job.array, notes, wait=job.wait, parsable=job.parsable,
                    base_dir=submit_dir, export=job.export)


def _container(given: dict[str, _Given], problem: Callable[[str, str], None]) -> dict[str, Any] | None:
    """The batch script's container (``#SBATCH --container-image`` …) as its step stores it."""
    options = {name: given[name].value for name in pyxis.OPTIONS if name in given}
    if not options:
        return None
    try:
        container = pyxis.container_of(options)
    except pyxis.PyxisError as exc:
        problem(exc.option.lstrip("-") if exc.option.lstrip("-") in given else next(iter(options)), exc.message)
        return None
    if container is None or container.image is None:
        problem(next(iter(options)), "a batch script's container needs --container-image")
        return None
    return json.loads(container.to_json())


def _script_name(source: str) -> str:
    stem = re.sub(r"\.(sbatch|slurm|sh|bash)$", "", source.rsplit("/", 1)[-1])
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-_")[:63]
    return cleaned if NAME_RE.fullmatch(cleaned or "-") else "sbatch"
