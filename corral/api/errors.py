"""The API's error shapes and the guards every route shares. Each error a route can answer
is documented in the OpenAPI document with its schema, so a client generated from it (or a
fuzzer checking it) meets no undocumented status or body."""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class ErrorOut(BaseModel):
    """A refusal with one sentence saying why (404, 409 …)."""

    detail: str


class SpecIssueOut(BaseModel):
    document: str
    field: str
    line: int | None
    message: str


class Rejection(BaseModel):
    message: str
    errors: list[SpecIssueOut]


class ValidationIssueOut(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class RejectedOut(BaseModel):
    """422: a job file that is not valid (every problem with its field and line), or a
    request whose parameters are not (FastAPI's list of issues)."""

    detail: Rejection | list[ValidationIssueOut]


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that may answer these statuses."""
    described = {400: "The request cannot be understood", 401: "No valid token (missing, unknown, revoked or expired)",
                 403: "The caller's role may not do this (the sentence names the role needed)", 404: "No such job, task or replica",
                 409: "The request conflicts with the job's state", 413: "The request body is too large",
                 422: "The request or the job file is invalid"}
    return {code: {"model": RejectedOut if code == 422 else ErrorOut, "description": described[code]}
            for code in statuses}


MAX_BODY = 8 << 20  # a job file is at most 1 MiB; room for envs and options around it


class Guard:
    """Refusals at the door, before routing: 413 for a body announced larger than ``MAX_BODY``,
    and 422 for a NUL byte in the path or query string (no name, id or state holds one, and
    PostgreSQL cannot even compare against one). An ASGI layer costs a few microseconds a
    request where a FastAPI dependency on every route costs tens."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _refusal(scope: Scope) -> JSONResponse | None:
        for key, value in scope["headers"]:
            if key == b"content-length" and (not value.isdigit() or int(value) > MAX_BODY):
                return JSONResponse({"detail": f"the request body is larger than {MAX_BODY >> 20} MiB"}, 413)
        where = "path" if "\x00" in scope["path"] else "query" if b"%00" in scope["query_string"] else None
        if where is not None:
            return JSONResponse({"detail": [{"loc": [where], "msg": "must not hold a NUL byte",
                                             "type": "value_error"}]}, 422)
        return None


def invalid_parameter(where: str, name: str, message: str, kind: str = "value_error") -> RequestValidationError:
    return RequestValidationError([{"loc": [where, name], "msg": message, "type": kind}])
