"""The long polls' waiting (corral.api.waits): woken by a new control cycle, by their timeout
or by the server stopping; the waiters on one job share one read per cycle."""

from __future__ import annotations

import asyncio
import time

from corral.api.waits import CycleWaits


def test_waiters_wake_on_the_next_cycle_not_before() -> None:
    cycles = [5]
    waits = CycleWaits(lambda: cycles[0])

    async def scenario() -> tuple[float, list[float]]:
        began = time.monotonic()
        woke: list[float] = []

        async def waiter() -> None:
            await waits.after(5, 30)
            woke.append(time.monotonic() - began)

        tasks = [asyncio.create_task(waiter()) for _ in range(50)]
        await asyncio.sleep(0.3)
        assert woke == []  # no new cycle yet: all of them still wait
        cycles[0] = 6
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return time.monotonic() - began, woke

    elapsed, woke = asyncio.run(scenario())
    assert len(woke) == 50 and min(woke) >= 0.29 and elapsed < 2


def test_a_waiter_whose_cycle_has_passed_returns_at_once_and_a_timeout_ends_a_wait() -> None:
    waits = CycleWaits(lambda: 7)

    async def scenario() -> tuple[float, float]:
        began = time.monotonic()
        await waits.after(6, 30)  # it saw an older cycle
        passed = time.monotonic() - began
        began = time.monotonic()
        await waits.after(7, 0.2)
        return passed, time.monotonic() - began

    passed, timed = asyncio.run(scenario())
    assert passed < 0.1 and 0.19 <= timed < 1.5


def test_a_stopping_server_wakes_every_waiter() -> None:
    waits = CycleWaits(lambda: 1)

    async def scenario() -> float:
        began = time.monotonic()
        tasks = [asyncio.create_task(waits.after(1, 60)) for _ in range(10)]
        await asyncio.sleep(0.1)
        waits.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await waits.after(1, 60)  # and a wait asked once it stops does not wait
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 1


def test_waiters_on_one_job_share_one_read_per_cycle() -> None:
    cycles = [1]
    waits = CycleWaits(lambda: cycles[0])
    calls: list[int] = []

    async def read() -> tuple[str, int]:
        calls.append(cycles[0])
        await asyncio.sleep(0.05)
        return "job", cycles[0]

    async def scenario() -> list:
        first = await asyncio.gather(*[waits.read(("7", "alice"), 1, read) for _ in range(30)])
        other = await waits.read(("8", "alice"), 1, read)  # another job: a read of its own
        cycles[0] = 2
        second = await asyncio.gather(*[waits.read(("7", "alice"), 2, read) for _ in range(30)])
        return [first, other, second]

    first, other, second = asyncio.run(scenario())
    assert calls == [1, 1, 2]
    assert set(first) == {("job", 1)} and other == ("job", 1) and set(second) == {("job", 2)}


def test_a_failed_read_fails_every_waiter_of_that_cycle_and_the_next_cycle_reads_again() -> None:
    cycles = [1]
    waits = CycleWaits(lambda: cycles[0])
    calls = []

    async def read():
        calls.append(1)
        if len(calls) == 1:
            raise LookupError("no job 7")
        return "back"

    async def scenario() -> tuple[list, str]:
        failed = await asyncio.gather(*[waits.read(("7", None), 1, read) for _ in range(5)], return_exceptions=True)
        cycles[0] = 2
        return failed, await waits.read(("7", None), 2, read)

    failed, again = asyncio.run(scenario())
    assert all(isinstance(f, LookupError) for f in failed) and again == "back" and len(calls) == 2
