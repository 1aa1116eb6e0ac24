"""runtime.drain.Inflight: new work refused once draining, work in flight awaited."""

from __future__ import annotations

import asyncio

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
