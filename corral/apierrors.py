"""The client's exceptions: a ``CorralError`` subclass per kind of refusal or failure, each with
the server's message, its HTTP status and (for an invalid job file) every issue with its field
and line; ``check`` turns an answer's status and body into one. ``corral.client`` re-exports
them (``from corral.client import NotFound``)."""

from __future__ import annotations

import json
from typing import Any


class CorralError(RuntimeError):
    """A refusal or failure, with the server's message, its HTTP status and (for an invalid
    job file) every issue with its field and line."""

    def __init__(self, message: str, status: int | None = None, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or []

    def __str__(self) -> str:
        """The message and, for an invalid job file, one line per issue with its line and field
        (what a script's traceback or log shows)."""
        lines = [self.message]
        for issue in self.errors:
            where = f"line {issue['line']}: " if issue.get("line") else ""
            field = f"{issue['field']}: " if issue.get("field") else ""
            document = f"{issue['document']}: " if issue.get("document") else ""
            lines.append(f"  {where}{document}{field}{issue.get('message', '')}")
        return "\n".join(lines)


class InvalidRequest(CorralError):
    """400/413/422: the request or the job file is invalid (``errors`` lists why)."""


class Unauthorized(CorralError):
    """401: no valid token (missing, unknown, revoked or expired)."""


class Forbidden(CorralError):
    """403: the caller's role may not do this (the message names the role needed)."""


class NotFound(CorralError):
    """404: no such job, task or replica."""


class Conflict(CorralError):
    """409: the job's state does not allow it."""


class Unavailable(CorralError):
    """The server cannot be reached, broke off, or its control loop keeps failing (503)."""


BY_STATUS: dict[int, type[CorralError]] = {400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                            409: Conflict, 413: InvalidRequest, 422: InvalidRequest, 503: Unavailable}


def check(status: int, data: bytes, url: str = "the server") -> None:
    if 200 <= status < 300:
        return
    if status < 400:  # corral's server never redirects: another server (a proxy, a login page) does
        raise Unavailable(f"{url} answered HTTP {status} (a redirect), which a corral server never does: is it "
                          "one, at its own address? (CORRAL_SERVER, corral login)", status)
    try:
        detail = json.loads(data)["detail"]
    except (ValueError, TypeError, KeyError):  # not corral's own error (its answers all say "detail")
        text = " ".join(data.decode(errors="replace").split())[:200]
        if status >= 500:
            raise Unavailable(f"the server at {url} failed (HTTP {status}){': ' + text if text else ''}",
                              status) from None
        raise Unavailable(f"{url} answered HTTP {status} without a corral error: is it a corral server? "
                          "(CORRAL_SERVER, corral login)", status) from None
    kind = BY_STATUS.get(status, CorralError)
    if isinstance(detail, dict):
        raise kind(detail.get("message", "request failed"), status, detail.get("errors"))
    if isinstance(detail, list):  # FastAPI request validation
        msgs = [f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail]
        raise kind("; ".join(msgs), status)
    raise kind(str(detail), status)
