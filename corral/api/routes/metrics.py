"""``GET /metrics`` for Prometheus, and the ASGI layer that times every API request by its
route template (``/v1/jobs/{job}``, never the raw path, so the label set stays small)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from corral.api.deps import ServerState
from corral.api.errors import documented
from corral.states import JobState
from corral.store.tables import Job

router = APIRouter(tags=["cluster"], responses=documented(401, 403))


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    """Jobs by state, pending jobs by reason and partition, GPUs allocated and idle per node,
    partition and account, whether each infra's engine answers and each partition is UP, fair-share factors, scheduler cycle and placement histograms,
    submit-to-start latency, restarts and probe failures by cause, API latency by route."""
    state: ServerState = request.app.state.corral
    body = await run_in_threadpool(generate_latest, state.loop.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def reader(state: ServerState):
    """What the scrape-time gauges read: the store for job counts and pending reasons (what
    ``corral queue`` shows), the loop's memory for GPUs and fair share."""

    def read() -> dict[str, Any]:
        loop = state.loop
        with state.sessions() as session:
            by_state = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
            pending: dict[tuple[str, str], int] = {}
            for reason, partition, count in session.execute(
                    select(Job.reason, Job.partition, func.count()).where(Job.state == JobState.PENDING.value)
                    .group_by(Job.reason, Job.partition)):
                pending[(reason or "None", partition or "")] = count
        view = loop.view
        free = {n.name: n for n in state.read(loop.reads.free_nodes)}
        nodes = [{"name": n.name, "gpu_type": n.gpu_type, "infra": view.node_infra.get(n.name, "local"),
                  "idle": len(free[n.name].free_gpus), "allocated": n.gpus - len(free[n.name].free_gpus)}
                 for n in view.nodes if n.name in free]
        partitions: dict[tuple[str, str], int] = {}
        policy = state.site.policy
        for p in policy.partitions or ():
            for n in nodes:
                if p.holds(n["name"]):
                    for kind in ("allocated", "idle"):
                        partitions[(p.name, kind)] = partitions.get((p.name, kind), 0) + n[kind]
        accounts: dict[str, int] = {}
        for holding in state.read(loop.reads.holdings):
            accounts[holding.account] = accounts.get(holding.account, 0) + holding.gpus
        share = [(r.account, r.user or "", r.fair_share) for r in state.read(loop.reads.share)]
        site = state.site
        infra_up = {name: 0 if name in view.unreachable else 1 for name in site.infras}
        partition_up = [(p.name, site.partition_infra.get(p.name, ""), 0 if p.name in view.down_partitions else 1)
                        for p in policy.partitions]
        return {"jobs_by_state": {s.value: by_state.get(s.value, 0) for s in JobState}, "pending": pending,
                "nodes": nodes, "partitions": partitions, "accounts": accounts, "fair_share": share,
                "infra_up": infra_up, "partition_up": partition_up}

    return read


class RequestTimer:
    """Observe every request's latency under its route template, method and status."""

    def __init__(self, app, metrics):  # noqa: ANN001 - an ASGI app and a Metrics
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message) -> None:  # noqa: ANN001
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(method=scope.get("method", ""), route=route,
                                         status=str(status[0])).observe(time.perf_counter() - started)
