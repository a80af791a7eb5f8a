"""Job traces (``job_id,user,submit_s,gpus,duration_s,gpu_type``, see shared/traces) and the
time limits users would have asked for.

Optional columns, for replaying a site's preemption (a trace without them replays as before):
``partition`` and ``qos`` (matched against a site config's); ``no_requeue`` (1/true: a
preemption cancels the job); ``checkpoint_s`` (the job saves its work every that many
seconds of progress, so a requeued job resumes from its last checkpoint; empty: it starts
over); ``restart_cost_s`` (seconds each restart after a requeue spends before progressing:
loading the checkpoint, warming up); ``min_gpus`` (elastic: the job is ``gpus`` one-GPU
replicas that preemption may shrink down to ``min_gpus``); ``max_gpus`` (with ``min_gpus``: it
also grows on its own into idle GPUs up to that many, ``num_nodes`` grow); ``dependency`` (Slurm's syntax on
the trace's job ids, ``afterok:7:9,afterany:12``; a dependency that can never be met, e.g. on
a job cancelled or not in the trace, cancels the job, like ``--kill-on-invalid-dep``).

Users over-estimate run times by a lot: Mu'alem & Feitelson (IEEE TPDS 2001) and Tsafrir,
Etsion & Feitelson (IEEE TPDS 2007) found requested limits are typically several times the
actual run time, heavily rounded to a few "round" values. We model that: a job's limit is
its true duration times U with log10(U) ~ Uniform(0, 1) (1x to 10x), rounded up to the next
of 15 min, 30 min, 1 h, 2 h, 4 h, 8 h, 12 h, 1 d, 2 d, 3 d, 7 d, 14 d, 30 d (then whole
30-day steps). Seeded, so a replay is repeatable."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

ROUND_LIMITS_S = [900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800, 259200, 604800, 1209600, 2592000]


DEPENDENCY_KINDS = ("after", "afterok", "afternotok", "afterany")


class TraceError(ValueError):
    """A bad value in a trace: says the file, the line and the column."""


@dataclass(frozen=True)
class TraceJob:
    id: str
    user: str
    submit_s: float
    gpus: int
    duration_s: float
    time_limit_s: float
    partition: str = ""
    qos: str = ""
    no_requeue: bool = False
    checkpoint_s: float | None = None
    restart_cost_s: float = 0.0
    min_gpus: int | None = None
    # an elastic job that grows on its own into idle GPUs up to this many (``num_nodes`` grow)
    max_gpus: int | None = None
    dependency: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (kind, trace job ids) each


def requested_limit(duration_s: float, rng: random.Random) -> float:
    wanted = max(1.0, duration_s) * 10 ** rng.uniform(0.0, 1.0)
    for limit in ROUND_LIMITS_S:
        if limit >= wanted:
            return float(limit)
    return float(math.ceil(wanted / ROUND_LIMITS_S[-1]) * ROUND_LIMITS_S[-1])


def load_trace(path: Path, limit: int | None = None, seed: int = 0, after: float | None = None) -> list[TraceJob]:
    """The trace's jobs in submit order; ``after``: only those submitted at or after that
    second (e.g. to leave out the Alibaba trace's resident pods)."""
    rng = random.Random(seed)
    jobs = []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            if limit is not None and len(jobs) >= limit:
                break
            if after is not None and float(row["submit_s"]) < after:
                continue
            duration = max(1.0, float(row["duration_s"]))
            gpus = math.ceil(float(row["gpus"] or 0))  # GPU-sharing pods round up to whole GPUs
            job = TraceJob(row["job_id"], row.get("user") or "anonymous", float(row["submit_s"]), gpus, duration,
                           requested_limit(duration, rng))
            if _PREEMPTION_COLUMNS & row.keys():
                job = _with_preemption(job, row, f"{path}:{reader.line_num}")
            jobs.append(job)
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


_PREEMPTION_COLUMNS = {"partition", "qos", "no_requeue", "checkpoint_s", "restart_cost_s", "min_gpus", "max_gpus",
                       "dependency"}


def _with_preemption(job: TraceJob, row: dict, where: str) -> TraceJob:
    def number(column: str, low: float) -> float | None:
        text = (row.get(column) or "").strip()
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            raise TraceError(f"{where}: {column}: expected a number, got {text!r}") from None
        if not value >= low or math.isinf(value):
            raise TraceError(f"{where}: {column}: must be a finite number of at least {low:g}, got {text!r}")
        return value

    flag = (row.get("no_requeue") or "").strip().lower()
    if flag not in ("", "0", "1", "true", "false", "yes", "no"):
        raise TraceError(f"{where}: no_requeue: expected 1/0 or true/false, got {flag!r}")
    checkpoint = number("checkpoint_s", 0.0)
    if checkpoint == 0.0:
        raise TraceError(f"{where}: checkpoint_s: must be above 0 (leave it empty for a job that keeps no work)")
    min_gpus = number("min_gpus", 1.0)
    if min_gpus is not None and (min_gpus != int(min_gpus) or min_gpus > job.gpus):
        raise TraceError(f"{where}: min_gpus: must be a whole number from 1 to the job's gpus ({job.gpus}), "
                         f"got {row['min_gpus']!r}")
    max_gpus = number("max_gpus", 1.0)
    if max_gpus is not None and (max_gpus != int(max_gpus) or max_gpus <= job.gpus or min_gpus is None):
        raise TraceError(f"{where}: max_gpus: a whole number above the job's gpus ({job.gpus}), on an elastic job "
                         f"(min_gpus), got {row['max_gpus']!r}")
    return replace(job, partition=(row.get("partition") or "").strip(), qos=(row.get("qos") or "").strip(),
                   max_gpus=None if max_gpus is None else int(max_gpus),
                   no_requeue=flag in ("1", "true", "yes"), checkpoint_s=checkpoint,
                   restart_cost_s=number("restart_cost_s", 0.0) or 0.0,
                   min_gpus=None if min_gpus is None else int(min_gpus),
                   dependency=_dependency(row.get("dependency") or "", where))


def _dependency(text: str, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, _, ids = part.partition(":")
        names = tuple(i.strip() for i in ids.split(":") if i.strip())
        if kind.strip().lower() not in DEPENDENCY_KINDS or not names:
            raise TraceError(f"{where}: dependency: expected KIND:ID[:ID...] with KIND one of "
                             f"{', '.join(DEPENDENCY_KINDS)}, got {part!r}")
        out.append((kind.strip().lower(), names))
    return tuple(out)


def load_nodes_csv(path: Path) -> list[tuple[str, int, str | None]]:
    """(name, gpus, model) from the Alibaba node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    with open(path, newline="") as fh:
        return [(row["sn"], int(float(row["gpu"] or 0)), row.get("model") or None) for row in csv.DictReader(fh)]
