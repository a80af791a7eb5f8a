"""Turns the text of a task file or a job group file into a ``JobSpec``, or a ``SpecError``
listing every problem with its document, field, line and, for typos, the nearest key."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.spec.resources import IGNORED_RESOURCE_FIELDS, Alternative
from corral.spec.mounts import corral_dirs, fill_variables, resolve_sources
from corral.spec.models import ENV_NAME_RE, NAME_RE, NAME_RULE, GroupHeader, JobSpec, Resources, TaskSpec, shown
from corral.spec.service import SCHEDULING_FIELDS, Scheduling
from corral.spec.source import Document, SourceError, load_documents
from corral.spec.world import World, check_environment, dropped, parse_export, select



@dataclass(frozen=True)
class SpecIssue:
    document: str
    field: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        field = f"{self.field}: " if self.field else ""
        return f"{where}{self.document}: {field}{self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"document": self.document, "field": self.field, "line": self.line, "message": self.message}


MAX_ISSUES = 50  # a 5,000-document file with one mistake each needs the first few, not a 500 KB answer


class SpecError(ValueError):
    def __init__(self, issues: list[SpecIssue], source: str = "<spec>"):
        issues = sorted(issues, key=lambda i: (i.line or 0))
        if len(issues) > MAX_ISSUES:
            more = len(issues) - MAX_ISSUES + 1
            issues = issues[:MAX_ISSUES - 1] + [SpecIssue("file", "", None, f"... and {more} more problems")]
        self.issues = issues
        self.source = source
        super().__init__("\n".join(f"{source}:{i.line}: {i.document}: {i.field + ': ' if i.field else ''}{i.message}"
                                   if i.line else f"{source}: {i}" for i in self.issues))


@dataclass(frozen=True)
class LoadedJob:
    spec: JobSpec
    warnings: list[str]


def load_job(text: str, *, source: str = "<spec>", default_name: str | None = None,
             name: str | None = None, env: dict[str, str] | None = None, secrets: dict[str, str] | None = None,
             base_dir: str | None = None, scheduling: dict[str, Any] | None = None,
             workdir: str | None = None, world: World | None = None, export_given: bool = True,
             drop: tuple[str, ...] = (), task_options: dict[str, Any] | None = None,
             own_dirs: tuple[str, ...] | None = None) -> LoadedJob:
    """Validate a whole file. ``name`` and ``env`` are the CLI's ``--name`` / ``--env``;
    ``base_dir`` is the submit directory: a task without ``workdir`` runs there and a relative
    ``workdir`` (or ``workdir``, the ``--workdir`` given for every task) resolves against it,
    as SkyPilot and Slurm do; every directory must exist. ``world`` (the submitter's
    environment and export mode) is checked and kept with the job (with ``export_given``, every
    variable its list names must be in that environment); only what its export mode selects is
    kept (never the session-only variables, nor those ``drop`` names). ``scheduling`` overrides
    job-level fields (``--partition``, ``--qos``, ``--time-limit`` …); ``task_options`` overrides a
    single-task file's ``num_nodes`` and resources (``sky launch``'s ``--num-nodes``, ``--gpus``,
    ``--cpus``, ``--memory``, ``--image-id``)."""
    try:
        docs = [d for d in load_documents(text) if d.data is not None]
    except SourceError as exc:
        raise SpecError([SpecIssue("file", "", exc.line, exc.message)], source) from None
    if not docs:
        raise SpecError([SpecIssue("file", "", None, "the file holds no task")], source)
    issues: list[SpecIssue] = []
    warnings: list[str] = []
    for doc in docs:
        if not isinstance(doc.data, dict):
            issues.append(SpecIssue(_doc_label(doc, len(docs)), "", doc.line,
                                    "expected a mapping of fields (key: value)"))
        else:
            issues += [SpecIssue(_doc_label(doc, len(docs)), _dotted(path), doc.line_of(path), NUL_MESSAGE)
                       for path in nul_paths(doc.data)]
    issues += _option_issues(name, env, base_dir, scheduling)
    issues += _option_issues(None, secrets, None, None, "secrets")
    issues += world_issues(world, workdir, export_given)
    if issues:
        raise SpecError(issues, source)
    docs = [fill_variables(doc, env) for doc in docs]  # ${VAR} in file_mounts and workdir, as sky launch

    scheduling_doc: Document | None = None
    pipeline = False
    if len(docs) == 1 and "execution" not in docs[0].data:
        header = None
        scheduling_doc, task = _split(docs[0])
        task_docs = [task]
    elif "execution" not in docs[0].data:
        # a serial pipeline: an optional first document with the pipeline's name (and its
        # scheduling fields), then the stages, run in order as one job
        pipeline = True
        scheduling_doc, head = _split(docs[0])
        header, task_docs = (head, docs[1:]) if set(head.data) <= {"name"} else (None, [head, *docs[1:]])
    else:
        header, task_docs = docs[0], docs[1:]
        scheduling_doc, header = _split(header)
    if task_options:
        if header is not None or pipeline or len(task_docs) != 1:
            issues.append(SpecIssue("options", ", ".join(sorted(task_options)), None, TASK_OVERRIDE_GROUP))
        else:
            task_docs = [_override_task(task_docs[0], task_options)]
    overrides = dict(scheduling or {})
    limit_override = _time_limit_override(overrides, issues)
    if overrides:
        scheduling_doc = replace(scheduling_doc, data={**scheduling_doc.data, **overrides}) if scheduling_doc \
            else Document(0, overrides, 0)
    scheduling = _validate(Scheduling, scheduling_doc, "header (document 1)" if header is not None else
                           _doc_label(task_docs[0], 1), issues, {}) if scheduling_doc is not None else Scheduling()
    tasks: list[TaskSpec] = []
    for doc in task_docs:
        ctx: dict[str, Any] = {"warnings": []}
        task = _validate(TaskSpec, doc, _doc_label(doc, len(docs)), issues, ctx)
        warnings += [f"{_doc_label(doc, len(docs))}: {w}" for w in ctx["warnings"]]
        if task is not None:
            tasks.append(task)

    if pipeline:
        spec = _pipeline(header, task_docs, tasks, issues, name, default_name, source)
        if scheduling is None:
            raise SpecError(issues, source)
        spec = spec.model_copy(update={"scheduling": scheduling})
    elif header is None:
        job_name = name or (tasks[0].name if tasks and tasks[0].name else None) or _safe_name(default_name)
        if tasks and tasks[0].name is None:
            tasks[0] = tasks[0].model_copy(update={"name": job_name})
        if issues:
            raise SpecError(issues, source)
        task_name = tasks[0].name or job_name
        if tasks and tasks[0].depends_on:
            issues.append(SpecIssue(_doc_label(task_docs[0], 1), "depends_on", task_docs[0].line_of(("depends_on",)),
                                    "a plain job has one task: there is nothing to depend on"))
        if issues or scheduling is None:
            raise SpecError(issues, source)
        spec = JobSpec(name=job_name, tasks=tuple(tasks), primary_tasks=(task_name,),
                       termination_delay={task_name: 0.0}, group=False, scheduling=scheduling,
                       time_limit=tasks[0].time_limit)
    else:
        spec = _group(header, task_docs, tasks, issues, warnings, name, default_name, source)
        if scheduling is None:
            raise SpecError(issues, source)
        limits = [t.time_limit for t in spec.tasks]
        job_limit = spec.time_limit or (max(limits) if all(x is not None for x in limits) else None)
        spec = spec.model_copy(update={"scheduling": scheduling, "time_limit": job_limit})
    if limit_override is not None:
        spec = spec.model_copy(update={"time_limit": limit_override})
    spec = _apply_env(spec, env or {}, docs, issues, source, secrets or {})
    home = (world.environment.get("HOME") if world is not None else None) or None
    if base_dir is not None or workdir is not None or world is not None:  # else: the file alone, checked
        spec = resolve_workdirs(spec, base_dir, workdir, home, docs, source)
        if own_dirs is None and any(task.file_mounts for task in spec.tasks):
            own_dirs = corral_dirs()
        spec = resolve_mounts(spec, base_dir, home, docs, source, own_dirs or ())
    if world is not None:
        mode = parse_export(world.export)
        # a variable asked for by name that the site never carries: say so rather than drop it unseen
        warnings += [f"--export: {name} is not carried: this site drops it (environment.drop in its config.yaml)"
                     for name in dropped(mode.names, drop)]
        spec = spec.model_copy(update={"world": World(cwd=base_dir, export=mode.text,
                                                      environment=select(world.environment, mode, drop))})
    return LoadedJob(spec, warnings)


NUL_MESSAGE = "holds a NUL byte (\\0), which no command, argument or environment variable can carry"


def nul_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every key or string under ``value`` that holds a NUL byte."""
    if isinstance(value, str):
        return [path] if "\x00" in value else []
    found: list[tuple] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                found.append(path + (key,))
            found += nul_paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += nul_paths(item, path + (i,))
    return found


def _option_issues(name: str | None, env: dict[str, str] | None, base_dir: str | None,
                   scheduling: dict[str, Any] | None, env_label: str = "env") -> list[SpecIssue]:
    """Values given beside the file (``--name``, ``--env``, the API body) pass the same
    rules as the file's own: what the control loop would later refuse is refused here."""
    issues = []
    if name is not None and not NAME_RE.fullmatch(name):
        issues.append(SpecIssue("options", "name", None, f"{shown(name)} is not a valid job name: {NAME_RULE}"))
    for key, value in (env or {}).items():
        if not ENV_NAME_RE.fullmatch(key):
            issues.append(SpecIssue("options", env_label, None, f"{shown(key)} is not a valid environment variable "
                                    "name (letters, digits and '_', not starting with a digit)"))
        elif not isinstance(value, str) or "\x00" in value:
            issues.append(SpecIssue("options", f"{env_label}.{key}", None, NUL_MESSAGE))
    if base_dir is not None and ("\x00" in base_dir or not Path(base_dir).is_absolute()):
        issues.append(SpecIssue("options", "cwd", None, f"{shown(base_dir)} must be an absolute path "
                                "(the submit directory, which relative workdirs resolve against)"))
    issues += [SpecIssue("options", _dotted(path), None, NUL_MESSAGE) for path in nul_paths(scheduling or {})]
    return issues


def _time_limit_override(overrides: dict[str, Any], issues: list[SpecIssue]) -> float | None:
    if overrides.get("time_limit") is None:
        overrides.pop("time_limit", None)
        return None
    from corral.spec.quantity import parse_duration
    try:
        value = parse_duration(overrides.pop("time_limit"))
    except ValueError as exc:
        issues.append(SpecIssue("options", "time_limit", None, str(exc)))
        return None
    if value <= 0:
        issues.append(SpecIssue("options", "time_limit", None, "must be > 0"))
        return None
    return value


TASK_OVERRIDE_GROUP = ("--num-nodes, --gpus, --cpus, --memory and --image-id set the fields of a file with one task; "
                       "a job group's or a pipeline's tasks are set in their own documents")


def _override_task(doc: Document, task: dict[str, Any]) -> Document:
    """The task's document with the options given beside the file over its own fields, as
    ``sky launch --num-nodes 2 --gpus H100:8`` overrides a task YAML's."""
    data = dict(doc.data)
    if task.get("num_nodes") is not None:
        data["num_nodes"] = task["num_nodes"]
    given = {k: v for k, v in task.items() if k != "num_nodes" and v is not None}
    if given:
        resources = data.get("resources")
        data["resources"] = {**(resources if isinstance(resources, dict) else {}), **given}
    return replace(doc, data=data)


def _split(doc: Document) -> tuple[Document | None, Document]:
    """The job-level scheduling fields of a document, and the rest of it."""
    data = doc.data
    assert isinstance(data, dict)
    mine = {k: v for k, v in data.items() if k in SCHEDULING_FIELDS}
    if not mine:
        return None, doc
    return replace(doc, data=mine), replace(doc, data={k: v for k, v in data.items() if k not in SCHEDULING_FIELDS})


def _task_doc(docs: list[Document], task: TaskSpec) -> Document:
    return next((d for d in docs if isinstance(d.data, dict) and d.data.get("name") == task.name), docs[-1])


def world_issues(world: World | None, workdir: str | None, export_given: bool = True) -> list[SpecIssue]:
    """The submitter's environment and export mode, and ``--workdir``, checked as the file's
    own fields are: every problem names its field."""
    issues = []
    if workdir is not None and (not isinstance(workdir, str) or not workdir.strip() or "\x00" in workdir):
        issues.append(SpecIssue("options", "workdir", None, "must be a directory path"))
    if world is None:
        return issues
    problem = check_environment(world.environment)
    if problem:
        issues.append(SpecIssue("options", "environment", None, f"the submitter's environment {problem}"))
    try:
        mode = parse_export(world.export)
    except ValueError as exc:
        return issues + [SpecIssue("options", "export", None, str(exc))]
    missing = [n for n in mode.names if n not in world.environment] if export_given else []
    if missing:
        issues.append(SpecIssue("options", "export", None, f"{', '.join(missing[:5])} "
                                f"{'is' if len(missing) == 1 else 'are'} not set in the submitting environment"))
    return issues


def resolve_workdirs(spec: JobSpec, base_dir: str | None, override: str | None, home: str | None,
                     docs: list[Document], source: str) -> JobSpec:
    """Every task's working directory, absolute: ``override`` (``--workdir``) for all, else
    its own ``workdir`` against ``base_dir`` (the submit directory), else ``base_dir``. A task
    without either keeps none (it starts in its user's home). ``~`` is the submitter's home."""
    issues, tasks = [], []
    for task in spec.tasks:
        written = override if override is not None else task.workdir
        field = "--workdir" if override is not None else "workdir"
        where = (None if override is not None else _task_doc(docs, task).line_of(("workdir",)))
        label = "options" if override is not None else f"task {task.name!r}"
        if written is None:
            task = task.model_copy(update={"workdir": base_dir})
        elif not isinstance(written, str):  # a git repository: cloned on the node
            pass
        else:
            text = written
            if text == "~" or text.startswith("~/"):
                text = (home or str(Path("~").expanduser())) + text[1:]
            if not text.startswith("/") and base_dir is None:
                issues.append(SpecIssue(label, field, where, f"{shown(written)} is relative, and the submission "
                                        "names no directory to resolve it against (cwd)"))
                tasks.append(task)
                continue
            path = Path(os.path.normpath(os.path.join(base_dir or "/", text)))
            problem = None if path.is_dir() else (f"{path} is not a directory" if path.exists()
                                                  else f"{path} is not a directory: it does not exist")
            if problem:
                issues.append(SpecIssue(label, field, where, problem + (
                    f" (resolved against the submit directory {base_dir})" if not text.startswith("/") else "")))
            task = task.model_copy(update={"workdir": str(path)})
        tasks.append(task)
    if issues:
        raise SpecError(list(dict.fromkeys(issues)), source)  # --workdir's problem once, not once per task
    return spec.model_copy(update={"tasks": tuple(tasks)})


def resolve_mounts(spec: JobSpec, base_dir: str | None, home: str | None, docs: list[Document],
                   source: str, own: tuple[str, ...] = ()) -> JobSpec:
    """Every task's ``file_mounts`` sources absolute (against the submit directory, as a
    relative ``workdir``) and present, and no remote path shadowing corral's ``own``
    directories, or a problem naming ``file_mounts.REMOTE``."""
    issues, tasks = [], []
    for task in spec.tasks:
        if task.file_mounts:
            mounts, problems = resolve_sources(task.file_mounts, base_dir, home, own)
            doc = _task_doc(docs, task)
            issues += [SpecIssue(f"task {task.name!r}", f"file_mounts.{remote}", doc.line_of(("file_mounts", remote)), why)
                       for remote, why in problems.items()]
            task = task.model_copy(update={"file_mounts": mounts})
        tasks.append(task)
    if issues:
        raise SpecError(issues, source)
    return spec.model_copy(update={"tasks": tuple(tasks)})


def _group(header: Document, task_docs: list[Document], tasks: list[TaskSpec], issues: list[SpecIssue],
           warnings: list[str], name: str | None, default_name: str | None, source: str) -> JobSpec:
    label = "header (document 1)"
    head = _validate(GroupHeader, header, label, issues, {})
    if head is not None:
        for key in sorted(set(header.data) - set(GroupHeader.model_fields)):
            hint = _suggest(key, set(GroupHeader.model_fields))
            warnings.append(f"{label}: unknown key {key!r} ignored (line {header.line_of((key,))})"
                            f"{hint or _suggest(key, set(SCHEDULING_FIELDS))}")
    if len(task_docs) < 2:
        issues.append(SpecIssue(label, "execution", header.line_of(("execution",)),
                                "a job group needs at least two task documents"))
    seen: dict[str, Document] = {}
    for doc, task in zip(task_docs, tasks):
        if task.name is None:
            issues.append(SpecIssue(_doc_label(doc, 0), "name", doc.line, "every task of a job group needs a name"))
        elif task.name in seen:
            issues.append(SpecIssue(_doc_label(doc, 0), "name", doc.line_of(("name",)),
                                    f"task name {task.name!r} is used twice (also document {seen[task.name].index + 1})"))
        else:
            seen[task.name] = doc
    if issues or head is None:
        raise SpecError(issues, source)
    names = [t.name for t in tasks]
    primaries = head.primary_tasks or names
    for i, primary in enumerate(head.primary_tasks or []):
        if primary not in names:
            issues.append(SpecIssue(label, f"primary_tasks[{i}]", header.line_of(("primary_tasks", i)),
                                    f"no task is named {primary!r}{_suggest(primary, set(names))}"))
    _check_dependencies(task_docs, tasks, names, issues)
    delay = head.termination_delay
    delays: dict[str, float]
    if isinstance(delay, dict):
        for key in delay:
            if key != "default" and key not in names:
                issues.append(SpecIssue(label, f"termination_delay.{key}", header.line_of(("termination_delay", key)),
                                        f"no task is named {key!r}{_suggest(key, set(names) | {'default'})}"))
        default = delay.get("default", 0.0)
        delays = {n: delay.get(n, default) for n in names}
    else:
        delays = {n: float(delay or 0.0) for n in names}
    if issues:
        raise SpecError(issues, source)
    job_name = name or head.name or _safe_name(default_name)
    return JobSpec(name=job_name, tasks=tuple(tasks), primary_tasks=tuple(primaries),
                   termination_delay=delays, group=True, time_limit=head.time_limit)


def _pipeline(header: Document | None, task_docs: list[Document], tasks: list[TaskSpec], issues: list[SpecIssue],
              name: str | None, default_name: str | None, source: str) -> JobSpec:
    """A serial pipeline: stages in file order (unnamed ones are ``stage-N``), each started
    once the one before it succeeded; the job's time limit is their sum when all have one."""
    if not task_docs:
        issues.append(SpecIssue("pipeline", "", header.line if header else None, "the pipeline has no stage"))
    named = []
    for i, (doc, task) in enumerate(zip(task_docs, tasks)):
        task = task if task.name else task.model_copy(update={"name": f"stage-{i}"})
        if task.depends_on:
            issues.append(SpecIssue(_doc_label(doc, 0), "depends_on", doc.line_of(("depends_on",)),
                                    "a pipeline's stages run in file order; depends_on belongs to job groups "
                                    "(execution: parallel)"))
        if task.name in [t.name for t in named]:
            issues.append(SpecIssue(_doc_label(doc, 0), "name", doc.line_of(("name",)),
                                    f"stage name {task.name!r} is used twice"))
        named.append(task)
    if issues:
        raise SpecError(issues, source)
    head_name = header.data.get("name") if header is not None else None
    if head_name is not None and (not isinstance(head_name, str) or not NAME_RE.fullmatch(head_name)):
        raise SpecError([SpecIssue("header (document 1)", "name", header.line_of(("name",)),
                                   f"a name uses {NAME_RULE}")], source)
    job_name = name or head_name or (named[0].name if len(named) == 1 else None) or _safe_name(default_name)
    limits = [t.time_limit for t in named]
    return JobSpec(name=job_name, tasks=tuple(named), primary_tasks=tuple(t.name for t in named),
                   termination_delay={t.name: 0.0 for t in named}, group=len(named) > 1, pipeline=True,
                   time_limit=sum(limits) if all(x is not None for x in limits) else None)  # type: ignore[arg-type]


def _check_dependencies(task_docs: list[Document], tasks: list[TaskSpec], names: list[str],
                        issues: list[SpecIssue]) -> None:
    """Every ``depends_on`` names another task of the group, and the order has no cycle."""
    graph: dict[str, set[str]] = {}
    for doc, task in zip(task_docs, tasks):
        graph[task.name] = set()
        for i, dep in enumerate(task.depends_on):
            line = doc.line_of(("depends_on", i, "task"))
            if dep.task == task.name:
                issues.append(SpecIssue(_doc_label(doc, 0), f"depends_on[{i}].task", line, "a task cannot depend on itself"))
            elif dep.task not in names:
                issues.append(SpecIssue(_doc_label(doc, 0), f"depends_on[{i}].task", line,
                                        f"no task is named {dep.task!r}{_suggest(dep.task, set(names))}"))
            else:
                graph[task.name].add(dep.task)
    cycle = find_cycle({name: sorted(deps) for name, deps in graph.items()})
    if cycle:
        doc = next(d for d, t in zip(task_docs, tasks) if t.name == cycle[0])
        issues.append(SpecIssue(_doc_label(doc, 0), "depends_on", doc.line_of(("depends_on",)),
                                f"start order has a cycle: {' -> '.join(cycle)}"))


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle of a directed graph as ``[a, b, …, a]``, or None (depth-first search)."""
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in graph.get(name, []):
            if state.get(nxt) == 1:
                walk = path + [name]
                return walk[walk.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [name])):
                return found
        state[name] = 2
        return None

    for name in graph:
        if name not in state and (found := visit(name, [])):
            return found
    return None


def _apply_env(spec: JobSpec, env: dict[str, str], docs: list[Document], issues: list[SpecIssue],
               source: str, extra_secrets: dict[str, str]) -> JobSpec:
    """``--env K=V`` overrides every task's envs and fills its secrets (a key a task declares as a
    secret stays one); ``--secret K=V`` makes K a secret of every task (never an env); a
    declared env or secret left without a value is an error."""
    tasks = []
    for task in spec.tasks:
        secrets = {k: env.get(k, v) for k, v in task.secrets.items()} | extra_secrets
        merged = {k: env.get(k, v) for k, v in task.envs.items() if k not in extra_secrets} | {
            k: v for k, v in env.items() if k not in secrets}
        for section, values in (("envs", merged), ("secrets", secrets)):
            for key, value in values.items():
                if value is None:
                    doc = _task_doc(docs, task)
                    issues.append(SpecIssue(f"task {task.name!r}", f"{section}.{key}", doc.line_of((section, key)),
                                            f"has no value; pass one with --env {key}=VALUE"))
        too_big = check_environment({**{k: v for k, v in merged.items() if v is not None},
                                     **{k: v for k, v in secrets.items() if v is not None}})
        if too_big is not None:  # (a process could not be started with it: refused now, not at launch)
            issues.append(SpecIssue(f"task {task.name!r}", "envs", None, f"with its secrets and --env {too_big}"))
        tasks.append(task.model_copy(update={"envs": merged, "secrets": secrets}))
    if issues:
        raise SpecError(issues, source)
    return spec.model_copy(update={"tasks": tuple(tasks)})


def _validate(model: type[BaseModel], doc: Document, label: str, issues: list[SpecIssue],
              ctx: dict[str, Any]) -> Any:
    try:
        return model.model_validate(doc.data, context=ctx)
    except ValidationError as exc:
        for err in exc.errors():
            # union members' tags (<path>, <repository>) are not fields the user wrote
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("<") and p.endswith(">"))
                        and p != "[key]")  # a mapping's key: the key itself names the field
            if not loc and isinstance(doc.data, dict):
                # A whole-model check: point at the first field of the document it names.
                named = [k for k in doc.data if isinstance(k, str) and re.search(rf"\b{re.escape(k)}\b", err["msg"])]
                loc = (named[0],) if named else ()
            issues.append(SpecIssue(label, _dotted(loc), doc.line_of(loc), _message(model, loc, err)))
        return None


def _message(model: type[BaseModel], loc: tuple, err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden" and loc:
        owner = model
        for part in loc[:-1]:
            field = owner.model_fields.get(part) if isinstance(part, str) else None
            owner = field.annotation if field is not None and isinstance(field.annotation, type) and \
                issubclass(field.annotation, BaseModel) else owner
        known = set(owner.model_fields)
        if owner in (Resources, Alternative):
            known |= IGNORED_RESOURCE_FIELDS
        return f"unknown field{_suggest(str(loc[-1]), known)}"
    msg = err["msg"]
    return msg.removeprefix("Value error, ")


def _suggest(word: str, choices: set[str]) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if not isinstance(part, int):  # a key as the user wrote it: printable and short
            part = str(part).replace("\x00", "\\0")
            part = part if len(part) <= 60 else part[:57] + "..."
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _doc_label(doc: Document, total: int) -> str:
    name = doc.data.get("name") if isinstance(doc.data, dict) else None
    if total == 1:
        return f"task {name!r}" if isinstance(name, str) else "task"
    return f"task {name!r} (document {doc.index + 1})" if isinstance(name, str) else f"document {doc.index + 1}"


def _safe_name(name: str | None) -> str:
    if name:
        cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-_")[:63]
        if NAME_RE.fullmatch(cleaned):
            return cleaned
    return "job"
