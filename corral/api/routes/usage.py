"""What the cluster's resources are used by: held right now (each replica's allocation, the
dashboard's GPU map) and over a time window (GPU- and CPU-hours per user or account,
bucketed for a chart). Read-only.

Every role reads both, whole (docs/security.md: users and viewers read the queue, nodes, fair
share and any job's status): each replica's node and GPUs are already in its job's status, and
the GPU-hours are the job list's times summed, which `corral acct` reads from /v1/jobs.
Narrowing them alone would hide nothing; the authentication the router requires is the rule."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from corral.api.deps import ClockDep, SessionDep, StateDep
from corral.api.errors import documented, invalid_parameter
from corral.api.histogram import MAX_BUCKETS, grid, spread, step_for
from corral.api.routes.jobs import moment
from corral.api.schemas import AccountingOut, AllocationOut, UsageSeriesOut, ts
from corral.spec.models import shown
from corral.store import repository

router = APIRouter(prefix="/v1", tags=["cluster"], responses=documented(401, 403))

_LAST = 253402214400.0  # 9999-12-31T00:00Z: later times cannot be written back as dates
_WHEN = {"json_schema_extra": {"format": "date-time"}, "max_length": 64}


@router.get("/allocations", response_model=list[AllocationOut])
def allocations(state: StateDep):
    """Every replica's node, GPU indices, CPUs and memory, with its job: which job holds
    which GPU."""
    return [AllocationOut(node=h.node, gpus=sorted(h.gpus), cpus=h.cpus, memory=h.memory, job=h.job,
                          job_name=h.job_name, user=h.user, account=h.account, replica=h.replica, state=h.state)
            for h in state.read(state.loop.reads.held)]


@router.get("/accounting", response_model=AccountingOut, responses=documented(422))
def accounting(session: SessionDep, clock: ClockDep,
               since: Annotated[str | None, Query(description="Window start (ISO 8601; UTC if no zone); default: a day before until", **_WHEN)] = None,
               until: Annotated[str | None, Query(description="Window end (ISO 8601); default: now", **_WHEN)] = None,
               by: Annotated[Literal["user", "account"], Query(description="Group by user or by account")] = "user",
               step: Annotated[float | None, Query(ge=1, le=366 * 86400, description=(
                   f"Seconds per bucket; default: a minute to a week, about 60 buckets; at most {MAX_BUCKETS} buckets"))] = None,
               user: Annotated[str | None, Query(max_length=64)] = None,
               account: Annotated[str | None, Query(max_length=64)] = None,
               partition: Annotated[str | None, Query(max_length=64)] = None):
    """GPU- and CPU-hours per user or account over a window, in time buckets (``corral acct``'s
    GPU-hours, clipped to the window: a job counts what it holds at once while its last run is
    inside it)."""
    now = clock()
    end = moment("until", until) if until is not None else now
    start = moment("since", since) if since is not None else end - 86400
    if not start < end:
        raise invalid_parameter("query", "since", f"the window must start before it ends (since "
                                f"{shown(since) if since else 'a day before until'} is not before until "
                                f"{shown(until) if until else 'now'})")
    if start < 0:
        raise invalid_parameter("query", "since", "the window starts before 1970-01-01, when no job ran")
    if end >= _LAST:
        raise invalid_parameter("query", "until", "the window must end before 9999-12-31")
    span = end - start
    chosen = step or step_for(span)
    if grid(start, end, chosen)[1] > MAX_BUCKETS:
        raise invalid_parameter("query", "step" if step else "since", f"{chosen:g} s makes {grid(start, end, chosen)[1]} "
                                f"buckets of the {span:g} s window; at most {MAX_BUCKETS}")
    step = chosen
    runs = repository.runs_between(session, start, end, user=user, account=account, partition=partition)
    series = spread(runs, (lambda r: r.user) if by == "user" else (lambda r: r.account), start, end, step, now)
    origin, count = grid(start, end, step)
    return AccountingOut(
        since=ts(start), until=ts(end), by=by, step=step, buckets=[ts(origin + i * step) for i in range(count)],
        series=[UsageSeriesOut(key=s.key, jobs=s.jobs, gpu_hours=round(s.gpu_hours, 9), cpu_hours=round(s.cpu_hours, 9),
                               gpu_hours_by_bucket=[round(v, 9) for v in s.gpu],
                               cpu_hours_by_bucket=[round(v, 9) for v in s.cpu]) for s in series])
