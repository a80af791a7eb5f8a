"""Builds the FastAPI application around a running server state."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from corral import __version__, web
from corral.api.deps import ServerState, get_identity
from corral.api.guard import Guard
from corral.api.routes import access, cluster, jobs, metrics, queue, shell, usage


def create_app(state: ServerState, manage_loop: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_loop:
            state.loop.start()
        try:
            yield
        finally:
            state.intake.stop()
            if manage_loop:
                state.loop.stop()

    # The API's description needs a token like the rest (docs/security.md: only the health
    # check is open). The /docs and /redoc pages are not served: they load their scripts from a
    # CDN and fetch /openapi.json without the token, so a browser could not use them anyway.
    app = FastAPI(title="corral", version=__version__, lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None, description="Gang-scheduled AI job groups: submit, watch, cancel.")
    app.state.corral = state
    state.loop.metrics.reader = metrics.reader(state)
    app.add_middleware(Guard)
    app.add_middleware(metrics.RequestTimer, metrics=state.loop.metrics)  # outermost: times refusals too
    # Every route but health needs a token (routes that also read the caller get the same,
    # computed once per request).
    authenticated = [Depends(get_identity)]
    app.include_router(jobs.router, dependencies=authenticated)
    app.include_router(queue.router, dependencies=authenticated)
    app.include_router(cluster.router, dependencies=authenticated)
    app.include_router(access.router, dependencies=authenticated)
    app.include_router(metrics.router, dependencies=authenticated)
    app.include_router(usage.router, dependencies=authenticated)
    app.include_router(shell.router)  # a WebSocket: it reads the token itself (api.routes.shell)
    app.include_router(cluster.public)

    @app.get("/openapi.json", include_in_schema=False, dependencies=authenticated)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    web.install(app)  # the dashboard, under /ui/ (static; its API calls carry the token)
    return app
