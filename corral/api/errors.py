"""The API's error shapes and the guards every route shares. Each error a route can answer
is documented in the OpenAPI document with its schema, so a client generated from it (or a
fuzzer checking it) meets no undocumented status or body."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel


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
    described = {400: "The request cannot be understood", 404: "No such job, task or replica",
                 409: "The request conflicts with the job's state", 413: "The request body is too large",
                 422: "The request or the job file is invalid"}
    return {code: {"model": RejectedOut if code == 422 else ErrorOut, "description": described[code]}
            for code in statuses}


async def printable_parameters(request: Request) -> None:
    """Refuse a NUL byte in the path or the query string at the door: no name, id or state
    holds one, and PostgreSQL cannot even compare against one."""
    bad = [("path", key) for key, value in request.path_params.items() if "\x00" in str(value)]
    bad += [("query", key) for key, value in request.query_params.multi_items() if "\x00" in value or "\x00" in key]
    if bad:
        raise RequestValidationError([{"loc": list(where), "msg": "must not hold a NUL byte", "type": "value_error"}
                                      for where in bad])


def invalid_parameter(where: str, name: str, message: str, kind: str = "value_error") -> RequestValidationError:
    return RequestValidationError([{"loc": [where, name], "msg": message, "type": kind}])
