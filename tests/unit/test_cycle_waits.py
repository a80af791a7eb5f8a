"""The long polls' waiting (corral.api.waits): a waiter wakes when a cycle writes its job (not
another's), at its timeout, or when the server stops; the waiters on one job share one read
per cycle."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from corral.api.waits import CycleWaits


@dataclass
class View:  # what the waits read of the loop's LoopView
    cycles: int = 0
    changes: tuple = ()


class Loop:
    def __init__(self) -> None:
        self.view = View()

    def cycle(self, *touched: int) -> None:
        n = self.view.cycles + 1
        self.view = View(n, (self.view.changes + ((n, frozenset(touched)),))[-256:])


def test_a_waiter_wakes_when_its_job_changes_not_when_another_does() -> None:
    loop = Loop()
    loop.cycle()
    waits = CycleWaits(lambda: loop.view)

    async def scenario() -> tuple[list, list, float]:
        began = time.monotonic()
        woke7: list[float] = []
        woke8: list[float] = []

        async def waiter(job: int, into: list) -> None:
            await waits.after(job, 1, 30)
            into.append(time.monotonic() - began)

        tasks = [asyncio.create_task(waiter(7, woke7)) for _ in range(50)]
        tasks += [asyncio.create_task(waiter(8, woke8)) for _ in range(50)]
        await asyncio.sleep(0.2)
        loop.cycle()  # a cycle that wrote nothing of theirs
        loop.cycle(9)
        await asyncio.sleep(0.2)
        assert woke7 == [] and woke8 == []
        loop.cycle(7)
        await asyncio.wait_for(asyncio.gather(*tasks[:50]), 5)
        assert woke8 == []  # job 8's waiters wait on
        loop.cycle(8, 3)
        await asyncio.wait_for(asyncio.gather(*tasks[50:]), 5)
        return woke7, woke8, time.monotonic() - began

    woke7, woke8, elapsed = asyncio.run(scenario())
    assert len(woke7) == len(woke8) == 50 and min(woke7) >= 0.39 and elapsed < 3


def test_a_change_already_published_returns_at_once_and_a_timeout_ends_a_wait() -> None:
    loop = Loop()
    loop.cycle()
    loop.cycle(7)  # cycle 2 wrote job 7, after the waiter's read at cycle 1
    waits = CycleWaits(lambda: loop.view)

    async def scenario() -> tuple[float, float]:
        began = time.monotonic()
        await waits.after(7, 1, 30)
        passed = time.monotonic() - began
        began = time.monotonic()
        await waits.after(7, 2, 0.2)
        return passed, time.monotonic() - began

    passed, timed = asyncio.run(scenario())
    assert passed < 0.1 and 0.19 <= timed < 1.5


def test_a_waiter_that_fell_behind_what_the_view_keeps_is_woken() -> None:
    loop = Loop()
    for _ in range(300):
        loop.cycle()
    waits = CycleWaits(lambda: loop.view)

    async def scenario() -> float:
        began = time.monotonic()
        await waits.after(7, 10, 30)  # cycles 11..44 are no longer kept: it cannot know, so it looks
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 0.1


def test_a_stopping_server_wakes_every_waiter() -> None:
    loop = Loop()
    loop.cycle()
    waits = CycleWaits(lambda: loop.view)

    async def scenario() -> float:
        began = time.monotonic()
        tasks = [asyncio.create_task(waits.after(j % 3, 1, 60)) for j in range(10)]
        await asyncio.sleep(0.1)
        waits.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await waits.after(1, 1, 60)  # and a wait asked once it stops does not wait
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 1


def test_nothing_is_kept_for_a_job_once_its_waiters_are_gone() -> None:
    loop = Loop()
    loop.cycle()
    waits = CycleWaits(lambda: loop.view)

    async def scenario() -> None:
        await asyncio.gather(*[waits.after(j, 1, 0.05) for j in range(100)])
        task = asyncio.create_task(waits.after(5, 1, 30))
        await asyncio.sleep(0.05)
        task.cancel()  # a client that went away
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert waits._waiting == {} and waits._on == {}


def test_waiters_on_one_job_share_one_read_per_cycle() -> None:
    loop = Loop()
    waits = CycleWaits(lambda: loop.view)
    calls: list[int] = []

    async def read() -> tuple[str, int]:
        calls.append(loop.view.cycles)
        await asyncio.sleep(0.05)
        return "job", loop.view.cycles

    async def scenario() -> list:
        loop.cycle()
        first = await asyncio.gather(*[waits.read((7, "alice"), 1, read) for _ in range(30)])
        other = await waits.read((8, "alice"), 1, read)  # another job: a read of its own
        loop.cycle(7)
        second = await asyncio.gather(*[waits.read((7, "alice"), 2, read) for _ in range(30)])
        return [first, other, second]

    first, other, second = asyncio.run(scenario())
    assert calls == [1, 1, 2]
    assert set(first) == {("job", 1)} and other == ("job", 1) and set(second) == {("job", 2)}


def test_a_failed_read_fails_every_waiter_of_that_cycle_and_the_next_cycle_reads_again() -> None:
    loop = Loop()
    waits = CycleWaits(lambda: loop.view)
    calls = []

    async def read():
        calls.append(1)
        if len(calls) == 1:
            raise LookupError("no job 7")
        return "back"

    async def scenario() -> tuple[list, str]:
        failed = await asyncio.gather(*[waits.read((7, None), 1, read) for _ in range(5)], return_exceptions=True)
        return failed, await waits.read((7, None), 2, read)

    failed, again = asyncio.run(scenario())
    assert all(isinstance(f, LookupError) for f in failed) and again == "back" and len(calls) == 2
