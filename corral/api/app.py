"""Builds the FastAPI application around a running server state."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from corral import __version__
from corral.api.deps import ServerState
from corral.api.routes import cluster, jobs


MAX_BODY = 8 << 20  # a job file is at most 1 MiB; room for envs and options around it


class BodyLimit:
    """413 for a request that announces a body larger than ``MAX_BODY``, before it is read."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if not length.isdigit() or int(length) > MAX_BODY:
                response = JSONResponse({"detail": f"the request body is larger than {MAX_BODY >> 20} MiB"}, 413)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(state: ServerState, manage_controller: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_controller:
            state.controller.start()
        try:
            yield
        finally:
            if manage_controller:
                state.controller.stop()

    app = FastAPI(title="corral", version=__version__, lifespan=lifespan,
                  description="Gang-scheduled AI job groups: submit, watch, cancel.")
    app.state.corral = state
    app.add_middleware(BodyLimit)
    app.include_router(jobs.router)
    app.include_router(cluster.router)
    return app
