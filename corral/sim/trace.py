"""Job traces (``job_id,user,submit_s,gpus,duration_s,gpu_type``, see shared/traces) and the
time limits users would have asked for.

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
from dataclasses import dataclass
from pathlib import Path

ROUND_LIMITS_S = [900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800, 259200, 604800, 1209600, 2592000]


@dataclass(frozen=True)
class TraceJob:
    id: str
    user: str
    submit_s: float
    gpus: int
    duration_s: float
    time_limit_s: float


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
        for row in csv.DictReader(fh):
            if limit is not None and len(jobs) >= limit:
                break
            if after is not None and float(row["submit_s"]) < after:
                continue
            duration = max(1.0, float(row["duration_s"]))
            gpus = math.ceil(float(row["gpus"] or 0))  # GPU-sharing pods round up to whole GPUs
            jobs.append(TraceJob(row["job_id"], row.get("user") or "anonymous", float(row["submit_s"]), gpus, duration,
                                 requested_limit(duration, rng)))
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


def load_nodes_csv(path: Path) -> list[tuple[str, int, str | None]]:
    """(name, gpus, model) from the Alibaba node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    with open(path, newline="") as fh:
        return [(row["sn"], int(float(row["gpu"] or 0)), row.get("model") or None) for row in csv.DictReader(fh)]
