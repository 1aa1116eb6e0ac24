"""runtime.drain.Inflight: new work refused once draining, work in flight awaited."""

from __future__ import annotations

import asyncio

import pytest

from runtime.drain import Inflight


async def test_drain_refuses_new_work_and_waits_for_work_in_flight() -> None:
    gate = Inflight()
    assert gate.enter() and gate.enter()
    drained = asyncio.create_task(gate.drain(3600))
    await asyncio.sleep(0)
    assert not gate.enter()  # refused, and not counted
    assert gate.count == 2 and not drained.done()
    gate.leave()
    await asyncio.sleep(0)
    assert not drained.done()
    gate.leave()
    assert await drained == 0


async def test_drain_returns_what_is_still_running_at_the_timeout() -> None:
    gate = Inflight()
    gate.enter()
    assert await gate.drain(0) == 1


async def test_drain_with_nothing_in_flight_returns_at_once() -> None:
    assert await Inflight().drain(3600) == 0


async def test_a_drain_cancelled_as_the_last_work_ends_stays_cancelled() -> None:
    """bpo-42130: with asyncio.wait_for on Python 3.11, a cancel arriving as the idle event
    fires was dropped (the drain returned 0 and its canceller waited on). asyncio.timeout
    passes it on."""
    for _ in range(20):
        inflight = Inflight()
        inflight.enter()
        task = asyncio.create_task(inflight.drain(10.0))
        for _ in range(3):
            await asyncio.sleep(0)
        inflight.leave()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
