"""Service endpoints: one TCP address per task with an ``endpoint`` (SkyServe's ``service``)
that spreads connections over the task's READY replicas, round robin or to the replica with
the fewest open connections. It runs on an asyncio loop of its own thread in the server
process; the control loop only tells it which replicas are ready (``route``). A connection
that finds no ready replica (or none that accepts) gets an HTTP 503 and is closed, as a
SkyServe load balancer answers when no replica is ready; for a service that can scale to
zero, the connection is first held (up to the ``hold`` the control loop gives) while a replica
comes back, forwarded once one is ready, and answered 503 with the reason otherwise.

It also counts the requests it forwards (``rate``), for load-based autoscaling. It forwards
bytes, not parsed HTTP, so a request is counted where one can start: a connection's first
bytes, and each later chunk from the client that opens with an HTTP method after the
replica has answered (a keep-alive client's next request). Pipelined requests count once."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Hashable

log = logging.getLogger("corral.balancer")

CONNECT_TIMEOUT_S = 2.0  # a replica that does not accept by then: the next one is tried
RATE_WINDOW_S = 60.0  # requests per second are measured over the last minute, as SkyServe does
_METHODS = (b"GET ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ", b"HEAD ", b"OPTIONS ")


def unavailable(words: str) -> bytes:
    """An HTTP 503 that says why in a sentence, and closes."""
    body = words.encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


class _Endpoint:
    def __init__(self, policy: str):
        self.policy = policy
        self.backends: list[tuple[str, int]] = []
        self.hold = 0.0  # how long a request that finds no ready replica waits for one
        self.why = ""  # why none is ready, in words (for the 503)
        self.routed = asyncio.Event()  # set (and replaced) at each route: held requests look again
        self.held = 0  # connections waiting for a replica now: demand, however old
        self.closed = False  # its job ended: a held connection is answered at once, not at its deadline
        self.open: dict[tuple[str, int], int] = {}
        self.turn = itertools.count()
        self.server: asyncio.AbstractServer | None = None
        self.arrivals: deque[float] = deque()  # monotonic times of requests, the last window's
        self.lock = threading.Lock()  # arrivals are read from the control loop's thread

    def arrived(self) -> None:
        now = time.monotonic()
        with self.lock:
            self.arrivals.append(now)
            while self.arrivals and self.arrivals[0] < now - RATE_WINDOW_S:
                self.arrivals.popleft()

    def rate(self) -> float:
        now = time.monotonic()
        with self.lock:
            while self.arrivals and self.arrivals[0] < now - RATE_WINDOW_S:
                self.arrivals.popleft()
            return len(self.arrivals) / RATE_WINDOW_S

    def order(self) -> list[tuple[str, int]]:
        """The backends to try for a new connection, best first."""
        backends = list(self.backends)
        if not backends:
            return []
        if self.policy == "least_load":
            return sorted(backends, key=lambda b: self.open.get(b, 0))
        start = next(self.turn) % len(backends)
        return backends[start:] + backends[:start]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.arrived()  # the connection's first request, answered or not: it is demand
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold
        while True:
            connected = await self._connect()
            if connected is not None:
                await self._forward(reader, writer, *connected)
                return
            left = deadline - loop.time()
            if left <= 0 or self.closed:
                break
            self.held += 1
            try:  # held: a replica is on its way (a service scaled to zero is coming back)
                await asyncio.wait_for(self.routed.wait(), left)
            except asyncio.TimeoutError:
                pass
            finally:
                self.held -= 1
        words = "no replica of it is ready yet"
        if self.closed:
            words = "its job has ended: no replica will serve it"
        elif self.hold > 0:
            words = f"no replica of it became ready within {self.hold:g}s" + (f": {self.why}" if self.why else "")
        try:
            writer.write(unavailable(words))
            await writer.drain()
        except OSError:
            pass
        writer.close()

    async def _connect(self):  # noqa: ANN202 - (backend, reader, writer) or None
        for backend in self.order():
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*backend), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                continue  # ready a moment ago, gone now: the next one
            return backend, up_reader, up_writer
        return None

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, backend: tuple[str, int],
                       up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        self.open[backend] = self.open.get(backend, 0) + 1
        try:
            answered = [False]  # the replica sent something since the client's last request
            await asyncio.gather(_pump(reader, up_writer, self._requests(answered)),
                                 _pump(up_reader, writer, lambda _: answered.__setitem__(0, True)))
        finally:
            self.open[backend] -= 1
            for w in (up_writer, writer):
                w.close()

    def _requests(self, answered: list[bool]):
        """Counts a keep-alive client's next requests on a connection."""
        def saw(data: bytes) -> None:
            if answered[0] and data.startswith(_METHODS):
                answered[0] = False
                self.arrived()
        return saw


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, saw=None) -> None:  # noqa: ANN001
    try:
        while data := await reader.read(65536):
            if saw is not None:
                saw(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):
        pass


class Balancer:
    """Endpoints by key. Thread-safe: called from the control loop; serves on its own loop."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self._endpoints: dict[Hashable, _Endpoint] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="corral-balancer", daemon=True)
        self._thread.start()

    def open(self, key: Hashable, port: int, policy: str) -> int:
        """Listen for ``key`` on ``port`` (0: any free one); returns the port. Raises OSError
        when the port cannot be had. Opening an open key changes nothing."""
        return asyncio.run_coroutine_threadsafe(self._open(key, port, policy), self._loop).result(10)

    async def _open(self, key: Hashable, port: int, policy: str) -> int:
        endpoint = self._endpoints.get(key)
        if endpoint is None or endpoint.server is None:
            endpoint = _Endpoint(policy)
            endpoint.server = await asyncio.start_server(endpoint.serve, self.host, port, reuse_address=True)
            self._endpoints[key] = endpoint
        return endpoint.server.sockets[0].getsockname()[1]

    def route(self, key: Hashable, backends: list[tuple[str, int]], hold: float = 0.0, why: str = "") -> None:
        """The replicas new connections to ``key`` may go to (its READY ones); while there are
        none, a connection waits up to ``hold`` seconds for one, then gets a 503 with ``why``."""
        def apply() -> None:
            endpoint = self._endpoints.get(key)
            if endpoint is not None:
                endpoint.backends, endpoint.hold, endpoint.why = list(backends), hold, why
                endpoint.routed.set()  # wakes the held connections
                endpoint.routed = asyncio.Event()

        self._loop.call_soon_threadsafe(apply)

    def close(self, key: Hashable) -> None:
        async def close() -> None:
            endpoint = self._endpoints.pop(key, None)
            if endpoint is not None:
                endpoint.closed = True
                endpoint.routed.set()  # held connections hear it now, not at the end of their hold
            if endpoint is not None and endpoint.server is not None:
                endpoint.server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)

    def rate(self, key: Hashable) -> float:
        """Requests per second to ``key`` over the last minute (0 for an unknown key)."""
        endpoint = self._endpoints.get(key)
        return endpoint.rate() if endpoint is not None else 0.0

    def held(self, key: Hashable) -> int:
        """Connections to ``key`` held now, waiting for a replica to be ready."""
        endpoint = self._endpoints.get(key)
        return endpoint.held if endpoint is not None else 0

    def keys(self) -> list[Hashable]:
        return list(self._endpoints)

    def stop(self) -> None:
        for key in self.keys():
            try:
                self.close(key)
            except Exception:  # stopping: nothing left to serve
                log.debug("closing endpoint %s failed", key, exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
