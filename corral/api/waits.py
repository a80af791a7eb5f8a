"""What the API's long polls wait on (``GET /v1/jobs/{job}?wait=S``): their job's changes.

A job changes in a control cycle (the loop is its only writer but for its submission), and
the loop publishes with each view which jobs its cycle wrote (``LoopView.changes``). One
watcher task per server follows those publications and wakes only the requests waiting on a
job that changed; the waiters on one job share one read of it per cycle. So a long poll holds
no thread or database connection while it waits, and hundreds of them on quiet jobs cost
next to nothing. What the job's answer takes from the loop's view rather than its rows (the
expected start of a pending job) is caught by a look every few seconds. Everything here runs
on the server's event loop: a single thread touches it, so it needs no lock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

LOOK_S = 0.02  # how often the watcher looks at the loop's view (an integer compare)


class CycleWaits:
    def __init__(self, view: Callable[[], object]):
        self._view = view  # () -> the loop's LoopView (its ``cycles`` and ``changes``)
        self._waiting: dict[int, asyncio.Event] = {}  # job id -> the event its waiters await
        self._on: dict[int, int] = {}  # job id -> how many wait on it
        self._watcher: asyncio.Task | None = None
        self._seen = -1  # the last cycle the watcher handled
        self._reads: dict[tuple, tuple[int, asyncio.Future]] = {}
        self.stopping = False  # the server is stopping: waiters answer now, rather than be cut off

    def changed_since(self, job_id: int, cycle: int) -> bool | None:
        """Whether a cycle after ``cycle`` wrote the job (None: too long ago to tell)."""
        changes = self._view().changes
        if changes and changes[0][0] > cycle + 1:
            return None
        return any(c > cycle and job_id in jobs for c, jobs in changes)

    async def after(self, job_id: int, cycle: int, timeout: float) -> bool:
        """Return once a cycle after ``cycle`` has written job ``job_id`` (True), or when the
        server stops (True), or after ``timeout`` seconds (False)."""
        if self.stopping or self.changed_since(job_id, cycle) is not False:
            return True
        if timeout <= 0:
            return False
        event = self._waiting.get(job_id)
        if event is None:
            event = self._waiting[job_id] = asyncio.Event()
        if self._watcher is None or self._watcher.done():
            self._seen = self._view().cycles
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self._on[job_id] = self._on.get(job_id, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._on[job_id] -= 1
            if not self._on[job_id]:  # its last waiter: nothing kept for the job
                del self._on[job_id]
                if self._waiting.get(job_id) is event:
                    del self._waiting[job_id]

    def stop(self) -> None:
        self.stopping = True
        self._wake(list(self._waiting))

    def _wake(self, job_ids) -> None:  # noqa: ANN001 - an iterable of job ids
        for job_id in job_ids:
            event = self._waiting.pop(job_id, None)
            if event is not None:
                event.set()

    async def _watch(self) -> None:
        while self._on:
            await asyncio.sleep(LOOK_S)
            view = self._view()
            if view.cycles == self._seen:
                continue
            changes = view.changes
            if changes and changes[0][0] > self._seen + 1:  # fell behind what the view keeps
                self._wake(list(self._waiting))
            else:
                self._wake({j for c, jobs in changes if c > self._seen for j in jobs if j in self._waiting})
            self._seen = view.cycles

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
