"""What the API's long polls wait on (``GET /v1/jobs/{job}?wait=S``): the control cycles.

A job changes in a control cycle (the loop is its only writer but for its submission), so a
long poll re-reads its job only after the loop has published a new view. One watcher task per
server notices each new view and wakes every waiting request at once, and the waiters on one
job share that cycle's read of it: a hundred clients waiting on a job cost one query per cycle,
not a hundred, and no thread or database connection while they wait. Everything here runs on
the server's event loop (no locks: a single thread touches it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

LOOK_S = 0.02  # how often the watcher looks at the loop's view (an integer compare)


class CycleWaits:
    def __init__(self, cycles: Callable[[], int]):
        self._cycles = cycles
        self._event: asyncio.Event | None = None
        self._watcher: asyncio.Task | None = None
        self._waiting = 0
        self._reads: dict[tuple, tuple[int, asyncio.Future]] = {}
        self.stopping = False  # the server is stopping: waiters answer now, rather than be cut off

    async def after(self, seen: int, timeout: float) -> None:
        """Return once a cycle later than ``seen`` is published, or after ``timeout`` seconds,
        or when the server stops."""
        if self._cycles() != seen or self.stopping or timeout <= 0:
            return
        if self._event is None:
            self._event = asyncio.Event()
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch(seen))
        event = self._event
        self._waiting += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1

    def stop(self) -> None:
        self.stopping = True
        self._wake()

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def _watch(self, seen: int) -> None:
        while self._waiting or self._event is not None:
            await asyncio.sleep(LOOK_S)
            now = self._cycles()
            if now != seen:
                seen = now
                self._wake()
            if not self._waiting:
                break

    async def read(self, key: tuple, cycle: int, read: Callable[[], Awaitable]):
        """``read()``'s answer, shared by every caller asking with the same ``key`` in the same
        ``cycle`` (an error too)."""
        held = self._reads.get(key)
        if held is None or held[0] != cycle:
            for old in [k for k, (c, f) in self._reads.items() if c != cycle and f.done()]:
                del self._reads[old]
            held = (cycle, asyncio.ensure_future(read()))
            self._reads[key] = held
        return await asyncio.shield(held[1])
