"""The API's door: refusals made before routing, and before a request's body is read.

- A body from a caller without a valid token: 401 at once, before a byte of it is read (every
  route that takes a body needs a token; anyone can reach the port).
- A body announced larger than ``MAX_BODY`` (``Content-Length``): 413 at once.
- A body of unannounced size (``Transfer-Encoding: chunked``): counted as it streams in and
  refused with 413 as soon as it passes ``MAX_BODY``, so the server never holds more than
  ``MAX_BODY`` and one chunk of it (uvicorn reads no further ahead than the app asks).
- A NUL byte in the path or query string: 422 (no name, id or state holds one, and PostgreSQL
  cannot even compare against one).

A refusal made before the body is read closes the connection: uvicorn would otherwise read,
and drop, whatever the client keeps sending. An ASGI layer costs a few microseconds a request
where a FastAPI dependency on every route costs tens. (FastAPI's own ``max_body_size`` arrived
only in its latest releases, answers a bare "Content Too Large" and keeps the connection
reading.)"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.auth.tokens import TokenBook

MAX_BODY = 8 << 20  # a job file is at most 1 MiB; room for envs and options around it
_CLOSE = {"Connection": "close"}


def too_large() -> JSONResponse:
    return JSONResponse({"detail": f"the request body is larger than {MAX_BODY >> 20} MiB"}, 413, headers=_CLOSE)


class Guard:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = chunked = authorization = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value
            elif key == b"transfer-encoding":
                chunked = value
            elif key == b"authorization":
                authorization = value
        has_body = chunked is not None or (length is not None and length != b"0")
        refusal = self._refusal(scope, length, has_body, authorization)
        if refusal is not None:
            await refusal(scope, receive, send)
        elif has_body:
            await self._bounded(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    @staticmethod
    def _refusal(scope: Scope, length: bytes | None, has_body: bool, authorization: bytes | None) -> JSONResponse | None:
        if has_body:
            tokens: TokenBook = scope["app"].state.corral.tokens
            unauthorized = tokens.refusal(authorization.decode("latin-1") if authorization is not None else None)
            if unauthorized is not None:
                return JSONResponse({"detail": unauthorized.detail}, 401, headers={**unauthorized.headers, **_CLOSE})
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
                return too_large()
        where = "path" if "\x00" in scope["path"] else "query" if b"%00" in scope["query_string"] else None
        if where is not None:
            return JSONResponse({"detail": [{"loc": [where], "msg": "must not hold a NUL byte",
                                             "type": "value_error"}]}, 422)
        return None

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with the body counted as it is read: past ``MAX_BODY`` the caller gets
        the 413 and the app a disconnect (it stops reading; what it answers goes nowhere)."""
        received, refused, started = 0, False, False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY:
                    refused = True
                    if not started:
                        await too_large()(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def answering(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, answering)
        except Exception:
            if not refused:  # a route's failure over a body cut short was answered (413) already
                raise
