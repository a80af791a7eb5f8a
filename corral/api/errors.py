"""The API's error shapes. Each error a route can answer is documented in the OpenAPI
document with its schema, so a client generated from it (or a fuzzer checking it) meets no
undocumented status or body. The refusals made at the door, before routing, are in ``guard``."""

from __future__ import annotations

from typing import Any

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
    described = {400: "The request cannot be understood", 401: "No valid token (missing, unknown, revoked or expired)",
                 403: "The caller's role may not do this (the sentence names the role needed)", 404: "No such job, task or replica",
                 409: "The request conflicts with the job's state", 413: "The request body is too large",
                 422: "The request or the job file is invalid",
                 429: "Too many of the caller's streams are open (the sentence says how many may be)"}
    return {code: {"model": RejectedOut if code == 422 else ErrorOut, "description": described[code]}
            for code in statuses}


def invalid_parameter(where: str, name: str, message: str, kind: str = "value_error") -> RequestValidationError:
    return RequestValidationError([{"loc": [where, name], "msg": message, "type": kind}])
