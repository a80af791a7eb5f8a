"""Long answers held open per user: a log followed until its job ends (or a whole log read
out) keeps a place while it streams, and one user holds at most ``limit`` places at once
(``api: {max_streams_per_user: N}`` in config.yaml); one more is refused with a 429 that says
so. Each open stream polls its files on the one event loop every request shares: 400 of them
from one user took ``/v1/health`` from 2 to 722 ms. A place is given back however the answer
ends: done, the client gone, the server stopping, or the stream cut because the reader's token
was revoked (``runtime.logs.follow``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from fastapi import HTTPException
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from corral.auth.roles import Identity


class HeldStream(StreamingResponse):
    """A streamed answer that gives its place back when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[bytes] | Iterator[bytes], media_type: str, streams: Streams,
                 user: str):
        super().__init__(content, media_type=media_type)
        self._streams, self._user = streams, user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._streams.close(self._user)


class Streams:
    """The places taken per user. Taken and given back on the event loop only: no lock."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: dict[str, int] = {}

    def open(self, who: Identity, content: AsyncIterator[bytes] | Iterator[bytes], media_type: str) -> HeldStream:
        """The answer streaming ``content``; a 429 when ``who`` holds every place already."""
        self.take(who)
        return HeldStream(content, media_type, self, who.user)

    def take(self, who: Identity) -> None:
        """A place for something long-lived of ``who``'s (a stream, a shell: given back with
        ``close``); a 429 when ``who`` holds every place already."""
        held = self._open.get(who.user, 0)
        if held >= self.limit:
            raise HTTPException(429, f"{who.user} has {held} log streams or shells open already, as many as one "
                                     f"user may (api: {{max_streams_per_user: {self.limit}}} in the server's "
                                     "config.yaml); end one (a `corral logs -f`, a `corral shell`, a dashboard "
                                     "job page) and try again")
        self._open[who.user] = held + 1

    def close(self, user: str) -> None:
        left = self._open.get(user, 0) - 1
        if left > 0:
            self._open[user] = left
        else:
            self._open.pop(user, None)

    def held(self, user: str) -> int:
        return self._open.get(user, 0)
