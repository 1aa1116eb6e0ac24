"""The admission plugin and its gates on a fake clock: waiting, waking, aborts, shedding,
deadlines, the server's hold (no network)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from filters.api import Context, Result, RouteInfo
from filters.errors import ClientError
from filters.plugins.admission.gate import Gates
from filters.plugins.admission.limits import pool_limits, saturated_limit
from filters.plugins.admission.plugin import AdmissionPlugin, shed_reply
from policy import Policy, load_policy_text
from policy.servers import Replicas
from tests.filters.conftest import FakeClock, make_services

POLICY = """
version: 1
filters: {{processes: {processes}}}
admission:
  gateways: {gateways}
  interactive: {{ttft_budget: 60s, max_queue: 2, max_queue_per_tenant: 2}}
  batch: {{ttft_budget: 60s, max_queue: 2, max_queue_per_tenant: 1}}
  tier_weights: {{pro: 3}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:9001, 127.0.0.1:9002]
    capacity: {{max_running_requests: {cap}}}
tiers:
  pro: {{lane: interactive}}
  free: {{lane: batch, allowed_lanes: [batch]}}
"""


def policy(cap: int = 1, gateways: int = 1, processes: int = 1) -> Policy:
    return load_policy_text(POLICY.format(cap=cap, gateways=gateways, processes=processes))


class Setup:
    def __init__(self, cap: int = 1) -> None:
        self.clock = FakeClock()
        self.wall = FakeClock(1_700_000_000.0)
        pol = policy(cap)
        self.gates = Gates(clock=self.clock, wall=self.wall)
        self.gates.configure(pol)
        services = replace(make_services(pol, self.clock), gates=self.gates)
        self.services = services
        self.plugin = AdmissionPlugin({}, services)
        self.holds: list[float] = []

    def ctx(self, tenant: str = "a", lane: str = "interactive", tier: str = "pro") -> Context:
        c = Context(route=RouteInfo(name="llm", pool="chat"), started=self.clock())
        c.tenant, c.lane, c.tier = tenant, lane, tier

        async def hold(seconds: float) -> None:
            self.holds.append(seconds)

        c.hold = hold
        return c

    async def headers(self, ctx: Context, **h: str) -> Result | None:
        return await self.plugin.request_headers(ctx, h, False)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_waiter_starts_when_a_slot_frees_and_asked_envoy_to_hold() -> None:
    s = Setup(cap=1)  # 2 replicas x 1 = 2 slots
    first, second = s.ctx(), s.ctx()
    assert await s.headers(first) is None and await s.headers(second) is None
    third = s.ctx("b")
    waiting = asyncio.create_task(s.headers(third))
    await settle()
    assert not waiting.done() and s.holds == [30.0]  # the lane's wait: half its TTFT budget
    await s.plugin.stream_end(first)
    assert await waiting is None
    assert s.gates.gate("chat").core.in_flight == 2  # type: ignore[union-attr]


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    s = Setup(cap=1)
    for _ in range(2):
        await s.headers(s.ctx())
    waiting = asyncio.create_task(s.headers(s.ctx("b")))
    await settle()
    gate = s.gates.gate("chat")
    assert gate is not None and len(gate.core.queues["interactive"]) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(gate.core.queues["interactive"]) == 0 and gate.core.in_flight == 2


async def test_a_full_lane_is_shed_with_retry_after_and_a_json_reason() -> None:
    s = Setup(cap=1)
    for _ in range(2):
        await s.headers(s.ctx("x", "batch", "free"))
    queued = asyncio.create_task(s.headers(s.ctx("x", "batch", "free")))
    await settle()
    r = await s.headers(s.ctx("x", "batch", "free"))  # the tenant's one batch place is taken
    queued.cancel()
    assert r is not None and r.reply is not None and r.reply.status == 503
    assert int(r.reply.headers["retry-after"]) >= 1 and int(r.reply.headers["retry-after-ms"]) > 0
    assert json.loads(r.reply.body)["error"]["code"] == "tenant_queue_full"


async def test_deadlines_passed_are_504_and_remaining_budgets_go_upstream() -> None:
    s = Setup(cap=1)
    past = str(int((s.wall() - 1) * 1000))
    r = await s.headers(s.ctx(), **{"x-request-deadline-ms": past})
    assert r is not None and r.reply is not None and r.reply.status == 504
    assert json.loads(r.reply.body)["error"]["code"] == "deadline_exceeded"
    later = str(int((s.wall() + 5) * 1000))
    r = await s.headers(s.ctx(), **{"x-request-deadline-ms": later, "x-request-timeout-ms": "2000"})
    assert r is not None and r.set_headers == {
        "x-request-timeout-ms": "2000",
        "x-envoy-upstream-rq-timeout-ms": "2000",
    }
    assert r.remove_headers == ("x-request-deadline-ms",)
    with pytest.raises(ClientError) as info:
        await s.headers(s.ctx(), **{"x-request-timeout-ms": "soon"})
    assert info.value.status == 400


async def test_a_waiter_whose_wait_runs_out_is_answered_with_retry_after() -> None:
    """Its bounded wait ends (the fake clock stands still: 503 timed_out, not 504): an
    answer, not a cancelled handler (Envoy would answer its own 504 without Retry-After)."""
    s = Setup(cap=1)
    for _ in range(2):  # one slot per replica
        await s.headers(s.ctx())
    r = await asyncio.wait_for(s.headers(s.ctx("b"), **{"x-request-timeout-ms": "50"}), 5.0)
    assert r is not None and r.reply is not None and r.reply.status == 503
    assert int(r.reply.headers["retry-after"]) >= 1
    assert json.loads(r.reply.body)["error"]["code"] == "timed_out"
    gate = s.gates.gate("chat")
    assert gate is not None and len(gate.core.queues["interactive"]) == 0


async def test_tier_weights_reach_the_queue() -> None:
    s = Setup(cap=1)
    for _ in range(2):
        await s.headers(s.ctx())
    queued = asyncio.create_task(s.headers(s.ctx("p", tier="pro")))
    await settle()
    gate = s.gates.gate("chat")
    assert gate is not None
    (t,) = gate.core.queues["interactive"].all()
    assert t.weight == 3
    queued.cancel()


def test_split_rule_and_saturation() -> None:
    assert pool_limits(policy(cap=8), "chat") == (16, None)
    assert pool_limits(policy(cap=8, gateways=2), "chat") == (8, None)
    assert pool_limits(policy(cap=8, gateways=2, processes=3), "chat") == (2, None)
    assert pool_limits(policy(cap=1, gateways=4, processes=2), "chat") == (1, None)
    # filter servers side by side behind the same Envoys each admit their share: the policy's
    # replicas.filters, or the processes one gateway runs (`up --replicas filters=N`: --instances)
    two = replace(policy(cap=8), replicas=Replicas(filters=2))
    assert pool_limits(two, "chat") == (8, None)
    assert pool_limits(policy(cap=8), "chat", local=2) == (8, None)
    assert pool_limits(two, "chat", local=1) == (16, None)  # what runs, not the file
    assert pool_limits(policy(cap=8, gateways=2), "chat", local=2 * 2) == (2, None)
    assert saturated_limit(10, 0.9) == 10 and saturated_limit(10, None) == 10
    assert saturated_limit(10, 1.5) == 5 and saturated_limit(10, 2.0) == 1


async def test_a_saturated_pool_admits_fewer() -> None:
    level: dict[str, Any] = {"chat": None}
    s = Setup(cap=2)  # 4 slots
    s.gates.saturation = level.get
    for _ in range(2):
        assert await s.headers(s.ctx()) is None
    level["chat"] = 1.5  # half: 2 slots, both taken
    waiting = asyncio.create_task(s.headers(s.ctx("b")))
    await settle()
    assert not waiting.done()
    level["chat"] = 0.5
    s.gates.gate("chat")
    await settle()
    assert waiting.done()


async def test_a_waiter_that_falls_behind_is_answered_then_not_at_the_end_of_its_wait() -> None:
    """A queued batch request whose predicted start moves past its 50 s budget (interactive
    now asks for every slot) gets its 503 with Retry-After as the gate next looks, on the
    fake clock long before its wait would end (the real wait would be 50 s)."""
    from prometheus_client import CollectorRegistry

    from filters.plugins.admission.core import Admission, LaneConfig, Shed
    from filters.plugins.admission.gate import AdmissionMetrics, PoolGate

    clock = FakeClock(0.0)
    core = Admission(
        [LaneConfig("interactive", 20, 20, 5.0), LaneConfig("batch", 20, 20, 50.0, 1.0, 0.25)],
        max_requests=4,
    )
    gate = PoolGate("chat", core, clock=clock, metrics=AdmissionMetrics(CollectorRegistry()))
    i = core.offer(0.0, "interactive", "i")
    assert not isinstance(i, Shed)
    core.release(1.0, i)  # interactive's hold time is measured
    for t in (15.0, 16.0, 17.0):  # so are batch's and the pool's completions
        b = core.offer(t, "batch", "b")
        assert not isinstance(b, Shed)
        core.release(t + 1.0, b)
    clock.now = 18.0
    for _ in range(4):
        assert not isinstance(await gate.acquire("batch", "b"), Shed)
    waiter = asyncio.create_task(gate.acquire("batch", "b"))
    await asyncio.sleep(0)
    assert len(core.queues["batch"]) == 1  # due in 0.25 s: it queues
    gate.observe(None)
    assert not waiter.done()
    clock.now += 0.1  # the gate looks again (every 50 ms at most)
    for _ in range(40):
        core.offer(clock.now, "interactive", "i")
    gate.observe(None)
    shed = await asyncio.wait_for(waiter, 1.0)
    assert isinstance(shed, Shed) and (shed.status, shed.reason) == (503, "fell_behind")
    assert shed.retry_after_s >= 1 and len(core.queues["batch"]) == 0
    reply = shed_reply(shed, "batch")
    assert reply.status == 503 and int(reply.headers["retry-after"]) == shed.retry_after_s
    assert json.loads(reply.body)["error"]["code"] == "fell_behind"
