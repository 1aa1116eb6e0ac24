"""The ladder reads the admission gate's own demand beside the pool state: the excess admission
holds at the gateway moves the ladder, with or without a control plane (fake clock, no network)."""

from __future__ import annotations

import asyncio

import pytest

from filters.plugins.admission.core import Shed
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.plugin import AdmissionPlugin
from policy import load_policy_text
from tests.filters.conftest import FakeClock, make_services
from tests.filters.ladder.test_plugin import POLICY, Setup


@pytest.fixture
def s() -> Setup:
    setup = Setup()
    setup.level = None  # no pool state: the control plane is silent
    setup.ladders.demand = setup.gates.demand  # as the filter server wires it
    return setup


async def test_slots_taken_and_waiters_step_the_ladder_without_pool_state(s: Setup) -> None:
    admission = AdmissionPlugin({}, s.services)
    assert s.gates.demand("chat") == 0.0 and s.ladders.step("chat") == 0
    first = s.ctx("pro", "interactive")
    assert await admission.request_headers(first, {}, False) is None  # chat's only slot
    assert s.gates.demand("chat") == 1.0
    assert s.ladders.step("chat") == 2  # every slot busy: clamp and fallback
    waiter = asyncio.create_task(admission.request_headers(s.ctx("pro", "interactive"), {}, False))
    await asyncio.sleep(0)  # queued behind the slot
    assert s.gates.demand("chat") == 2.0
    assert s.ladders.step("chat") == 3  # as many waiting as running: batch is shed
    out = await s.plugin.request_headers(s.ctx("free", "batch"), {}, False)
    assert out is not None and out.reply is not None and out.reply.status == 503
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert s.gates.demand("chat") == 1.0  # the waiter left the queue
    assert s.ladders.step("chat") == 3  # dwells
    s.clock.now += 5
    assert s.ladders.step("chat") == 2  # dwell over: down to the steps 1.0 still holds
    await admission.stream_end(first)  # the slot is free
    assert s.gates.demand("chat") == 0.0
    s.clock.now += 5
    assert s.ladders.step("chat") == 0


async def test_the_higher_reading_wins(s: Setup) -> None:
    s.level = 1.6  # the pool state: replicas queue (another gateway's load)
    assert s.gates.demand("chat") == 0.0
    assert s.ladders.level("chat") == 1.6 and s.ladders.step("chat") == 3
    s.level = 0.0
    s.clock.now += 5
    assert s.ladders.step("chat") == 0


def test_a_pool_without_a_limit_has_no_demand() -> None:
    clock = FakeClock()
    policy = load_policy_text(POLICY.replace("    capacity: {max_running_requests: 1}\n", "", 1))
    gates = Gates(clock=clock, wall=clock)
    gates.configure(policy)
    assert gates.demand("chat") is None  # not limited (nothing reported yet)
    assert gates.demand("nowhere") is None
    gates.capacity = lambda pool: 4
    gates.follow_reported()
    assert gates.demand("chat") == 0.0


async def test_a_ladder_shed_is_told_the_later_of_the_dwell_and_the_lanes_drain(s: Setup) -> None:
    """Nothing measured: the lane's longest wait (batch: half its 30 s budget), later for each
    client told; measured: the drain, but never before the ladder could step down."""
    s.level = 1.6
    first = await s.plugin.request_headers(s.ctx("free", "batch"), {}, False)
    assert first is not None and first.reply is not None
    assert first.reply.headers["retry-after"] == "15"
    second = await s.plugin.request_headers(s.ctx("free", "batch"), {}, False)
    assert second is not None and second.reply is not None
    assert int(second.reply.headers["retry-after"]) >= 15
    gate = s.gates.gate("chat")
    assert gate is not None
    assert gate.core.told["batch"].claimed == 0  # counted as told, none came back yet


async def test_a_fast_draining_lane_is_told_its_place_not_the_dwell(s: Setup) -> None:
    """The shed step's ``Retry-After`` is admission's: the lane's return order at its measured
    drain (10 a second here), not the step's dwell that every client shed would share."""
    s.level = 0.0
    admission = AdmissionPlugin({}, s.services)
    for _ in range(40):  # batch drains 10 a second through the one slot
        ctx = s.ctx("free", "batch")
        assert await admission.request_headers(ctx, {}, False) is None
        s.clock.now += 0.1
        await admission.stream_end(ctx)
    s.level = 1.6
    out = await s.plugin.request_headers(s.ctx("free", "batch"), {}, False)
    assert out is not None and out.reply is not None
    assert out.reply.headers["retry-after"] == "1"
    assert 0.1 <= int(out.reply.headers["retry-after-ms"]) / 1000 < 0.5


async def test_a_batch_runners_lines_running_are_not_the_ladders_demand(s: Setup) -> None:
    """A runner's line holds its slot like any request, but while it runs it is no overload
    (poolstate/valley.py): the runner yields it itself. Queued, it is demand again."""
    gate = s.gates.gate("chat")
    assert gate is not None
    line = await gate.acquire("batch", "t", valley=True)
    assert not isinstance(line, Shed) and line.valley
    assert s.gates.demand("chat") == 0.0 and s.ladders.step("chat") == 0
    waiter = asyncio.create_task(gate.acquire("batch", "t", valley=True))
    await asyncio.sleep(0)  # queued behind it: the pool cannot serve it now
    assert s.gates.demand("chat") == 1.0
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    gate.release(line)
    assert s.gates.demand("chat") == 0.0
    other = await gate.acquire("batch", "t")  # anyone else's request counts
    assert not isinstance(other, Shed)
    assert s.gates.demand("chat") == 1.0
    gate.release(other)
    assert s.gates.demand("chat") == 0.0


def test_the_admission_plugin_marks_the_batch_line_routes_lines() -> None:
    text = POLICY.replace(
        "gateways:",
        "services:\n  batch-api: {endpoints: [127.0.0.1:9003]}\n"
        "batch: {service: batch-api, gateway: edge, pool: chat}\ngateways:",
    ).replace(
        "    routes:\n",
        "    routes:\n"
        "      - {name: jobs, match: {prefix: /v1/batches}, service: batch-api, filters: "
        "{plugins: [{name: identity, settings: {forward_authorization: true}}]}}\n"
        "      - name: lines\n"
        "        match: {prefix: /v1/, headers: {x-batch-line: '1'}}\n"
        "        pool: chat\n"
        "        filters: {plugins: [identity, idempotency, lane, admission]}\n",
    )
    plugin = AdmissionPlugin({}, make_services(load_policy_text(text), FakeClock()))
    assert plugin.valley_routes == frozenset({"lines"})
