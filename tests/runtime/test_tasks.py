"""stop_task and honour_cancel: a cancellation a library swallowed must not hang a shutdown
(the rate-limit service's Redis seeder lost one mid-pipeline and its close waited forever)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.tasks import honour_cancel, stop_task

pytestmark = pytest.mark.timeout(30)  # before the fix, a task that never stops hung stop_task


async def _swallowing_call(swallow: int, swallowed: list[int]) -> None:
    """A library call that turns the first ``swallow`` cancellations it gets into a return."""
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if len(swallowed) >= swallow:
                raise
            swallowed.append(1)
            return


async def test_a_task_that_swallowed_its_cancellation_is_cancelled_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    swallowed: list[int] = []

    async def loop() -> None:  # a background loop that carries on after the call returns
        while True:
            await _swallowing_call(1, swallowed)

    task = asyncio.create_task(loop(), name="seeder")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        async with asyncio.timeout(3):  # before: stop_task waited forever
            await stop_task(task)
    assert swallowed == [1] and task.cancelled()
    assert any("seeder outlived its cancellation" in r.getMessage() for r in caplog.records)


async def test_a_task_that_never_stops_is_left_behind_after_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stubborn = True

    async def deaf() -> None:
        while stubborn:
            with pytest.raises(asyncio.CancelledError):
                await asyncio.Event().wait()

    task = asyncio.create_task(deaf(), name="deaf")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with caplog.at_level(logging.ERROR):
        await stop_task(task, limit=0.3)
    assert 0.25 <= loop.time() - began < 2.0
    assert not task.done()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "deaf did not stop within 0.3s" in record.getMessage()
    stubborn = False
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()


async def test_honour_cancel_raises_a_cancellation_a_call_swallowed() -> None:
    swallowed: list[int] = []
    reached: list[str] = []

    async def seeder() -> None:
        await _swallowing_call(1, swallowed)
        honour_cancel()
        reached.append("after")  # must not run: the task was asked to stop

    task = asyncio.create_task(seeder())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert swallowed == [1] and reached == []


async def test_honour_cancel_is_silent_without_a_cancel_request() -> None:
    honour_cancel()  # nothing asked the test's own task to stop
