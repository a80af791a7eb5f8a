"""Builds the FastAPI application around a running server state."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from corral import __version__, web
from corral.api.deps import ServerState, get_identity
from corral.api.errors import Guard
from corral.api.routes import access, cluster, jobs, metrics, usage


def create_app(state: ServerState, manage_controller: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_controller:
            state.controller.start()
        try:
            yield
        finally:
            state.intake.stop()
            if manage_controller:
                state.controller.stop()

    app = FastAPI(title="corral", version=__version__, lifespan=lifespan,
                  description="Gang-scheduled AI job groups: submit, watch, cancel.")
    app.state.corral = state
    state.controller.metrics.reader = metrics.reader(state)
    app.add_middleware(Guard)
    app.add_middleware(metrics.RequestTimer, metrics=state.controller.metrics)  # outermost: times refusals too
    # Every route but health needs a token (routes that also read the caller get the same,
    # computed once per request).
    authenticated = [Depends(get_identity)]
    app.include_router(jobs.router, dependencies=authenticated)
    app.include_router(cluster.router, dependencies=authenticated)
    app.include_router(access.router, dependencies=authenticated)
    app.include_router(metrics.router, dependencies=authenticated)
    app.include_router(usage.router, dependencies=authenticated)
    app.include_router(cluster.public)
    web.install(app)  # the dashboard, under /ui/ (static; its API calls carry the token)
    return app
