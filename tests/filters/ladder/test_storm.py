"""A retry storm against the degradation ladder's shed step, on a fake clock (no network): the
clients shed are told return times spread at the lane's drain, a client back when told is let
through to its place ahead of fresh arrivals, and the step is left as soon as the demand it
refuses fits (not after its blind dwell), without flapping back."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from filters.api import Context
from filters.plugins.admission.plugin import AdmissionPlugin
from filters.plugins.degrade.state import SETTLE_S
from tests.filters.ladder.test_plugin import Setup


@pytest.fixture
def s() -> Setup:
    setup = Setup()
    setup.level = None  # no pool state: the gate's demand alone moves the ladder
    setup.ladders.demand = setup.gates.demand  # as the filter server wires it
    setup.ladders.stepped_down = setup.gates.stopped_refusing
    setup.ladders.expected = setup.gates.expected
    return setup


def headers(i: int) -> dict[str, str]:
    return {"content-length": "100", "idempotency-key": f"req-{i}"}


async def drain_batch(s: Setup, admission: AdmissionPlugin, n: int = 40) -> None:
    """Measure the batch lane draining 10 a second through chat's one slot."""
    for _ in range(n):
        ctx = s.ctx("free", "batch")
        assert await admission.request_headers(ctx, {}, False) is None
        s.clock.now += 0.1
        await admission.stream_end(ctx)


async def shed(s: Setup, ctx: Context, h: dict[str, str]) -> float | None:
    """The seconds the degrade plugin told this request to wait (None: let through)."""
    out = await s.plugin.request_headers(ctx, h, False)
    if out is None or out.reply is None:
        return None
    assert out.reply.status == 503 and out.reply.headers["retry-after"]
    return int(out.reply.headers["retry-after-ms"]) / 1000


async def test_a_shed_burst_is_told_return_times_spread_at_the_drain(s: Setup) -> None:
    admission = AdmissionPlugin({}, s.services)
    await drain_batch(s, admission)
    s.level = 1.6
    told = [await shed(s, s.ctx("free", "batch"), headers(i)) for i in range(30)]
    assert all(t is not None for t in told)
    waits = [t for t in told if t is not None]
    assert waits == sorted(waits) and len(set(waits)) == len(waits)  # no two share a time
    gaps = [b - a for a, b in itertools.pairwise(waits)]
    assert min(gaps) >= 0.09 and max(gaps) <= 0.11  # one per 1/10 s, the lane's drain
    assert waits[-1] < 4.0  # 30 clients, 10 a second: no step dwell imposed


async def test_a_client_back_when_told_passes_the_shed_step_ahead_of_fresh(s: Setup) -> None:
    admission = AdmissionPlugin({}, s.services)
    await drain_batch(s, admission)
    s.level = 1.6
    wait = await shed(s, s.ctx("free", "batch"), headers(1))
    assert wait is not None
    s.clock.now += wait  # back as told, the step still on
    assert s.ladders.step("chat") == 3
    back = s.ctx("free", "batch")
    assert await shed(s, back, headers(1)) is None  # let through the shed step ...
    assert await admission.request_headers(back, headers(1), False) is None  # ... and admitted
    fresh = await shed(s, s.ctx("free", "batch"), headers(2))
    assert fresh is not None  # a fresh request of the lane is still shed
    assert 'tokenweir_filters_ladder_requests_total{action="returned",pool="chat"} 1.0' in (
        s.metrics()
    )
    gate = s.gates.gate("chat")
    assert gate is not None and gate.core.told["batch"].claimed == 1
    # a client back too early is shed again (and counted once as demand, not as a new one)
    early = s.ctx("free", "batch")
    refused = gate.core.refused["batch"]
    before = len(refused._events)
    assert await shed(s, early, headers(2)) is not None
    assert len(refused._events) == before


async def test_the_shed_step_is_left_once_the_refused_demand_fits(s: Setup) -> None:
    """A storm: the queue takes the ladder to its shed step; fresh requests keep coming, are
    refused and counted, so the step holds; once they fall to what fits, the step is left
    after ``SETTLE_S``, not after the 5 s dwell, and does not come back."""
    admission = AdmissionPlugin({}, s.services)
    await drain_batch(s, admission)
    running = s.ctx("pro", "interactive")
    assert await admission.request_headers(running, {}, False) is None  # the only slot
    s.level = 1.6  # (the pool state saw the spike) ...
    assert s.ladders.step("chat") == 3
    s.level = None  # ... and the gate's reading alone decides from here
    for i in range(40):  # the storm: 20 fresh a second, refused and counted
        assert await shed(s, s.ctx("free", "batch"), headers(100 + i)) is not None
        s.clock.now += 0.05
    assert s.ladders.level("chat") is not None and s.ladders.level("chat") >= 1.2
    assert s.ladders.step("chat") == 3  # the refused demand does not fit: holds
    await admission.stream_end(running)
    s.clock.now += 2.5  # the storm is over: the refused rate falls out of its window
    assert s.ladders.step("chat") == 0  # well before the 5 s dwell since the last entry
    assert SETTLE_S < 5.0
    # the steps it went down through are counted, and it does not come back: fresh batch at
    # a rate the pool serves is admitted
    for i in range(10):
        ctx = s.ctx("free", "batch")
        assert await shed(s, ctx, headers(200 + i)) is None
        assert await admission.request_headers(ctx, headers(200 + i), False) is None
        s.clock.now += 0.3
        await admission.stream_end(ctx)
        assert s.ladders.step("chat") < 3


async def test_clients_back_when_told_hold_the_step_but_do_not_take_it(s: Setup) -> None:
    """Queued for their promised place, told clients coming back are demand (the shed step
    holds for them) but not a new spike (they do not take the shed step)."""
    admission = AdmissionPlugin({}, s.services)
    await drain_batch(s, admission)
    gate = s.gates.gate("chat")
    assert gate is not None
    running = s.ctx("pro", "interactive")
    assert await admission.request_headers(running, {}, False) is None  # the only slot
    now = s.clock()
    for i in range(3):  # three clients told to come back now, back together
        gate.core.told["batch"].add(now, 0.0, ("t-pro", "100", f"req-{i}"), "t-pro")
    waiting = []
    for i in range(3):  # (pro in the batch lane: only the shed step names it)
        ctx = s.ctx("pro", "batch")
        assert await s.plugin.request_headers(ctx, headers(i), False) is None
        waiting.append(asyncio.create_task(admission.request_headers(ctx, headers(i), False)))
    await asyncio.sleep(0)
    assert s.gates.demand("chat") == 4.0 and s.gates.expected("chat") == 3.0
    assert s.ladders.step("chat") == 2  # every slot busy: clamp and fallback, but no shed
    # fresh requests queued on top are a spike: the shed step is taken, and the returning
    # clients hold it while they wait
    fresh = s.ctx("pro", "batch")
    assert await s.plugin.request_headers(fresh, headers(9), False) is None
    waiting.append(asyncio.create_task(admission.request_headers(fresh, headers(9), False)))
    await asyncio.sleep(0)
    assert s.ladders.step("chat") == 3
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
