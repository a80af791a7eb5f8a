"""Builds the FastAPI application around a running server state."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

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
                # its connections closed now, not by the garbage collector: a server stopped
                # in a process that goes on (embedded use, tests) keeps no database files open
                state.sessions.kw["bind"].dispose()

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

    app.add_exception_handler(RequestValidationError, _invalid)
    web.install(app)  # the dashboard, under /ui/ (static; its API calls carry the token)
    return app


async def _invalid(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422, unless what was sent holds a lone surrogate (JSON allows ``\\udcff``),
    which its UTF-8 rendering cannot encode: then the same body with every non-ASCII character
    escaped, rather than a 500."""
    try:
        return await request_validation_exception_handler(request, exc)
    except UnicodeEncodeError:
        body = json.dumps({"detail": jsonable_encoder(exc.errors())}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")
