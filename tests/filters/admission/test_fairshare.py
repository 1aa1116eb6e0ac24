"""Tenants' token counters shared between filter processes (``filters/plugins/admission/fairshare.py``):
two gates, as two filter processes sharing one pool, over a real Redis; each counts what the
other served; Redis gone, each counts its own; the fairness gauges."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from filters.plugins.admission.core import Admission, LaneConfig
from filters.plugins.admission.fairshare import FairShare, fairshare_key
from filters.plugins.admission.gate import AdmissionMetrics, PoolGate
from runtime.ports import free_port

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Process:
    """One filter process's gates (the part FairShare reads)."""

    def __init__(self, clock: Clock, split: int = 2) -> None:
        core = Admission(
            [LaneConfig("batch", max_wait=5.0, max_queue=8, max_queue_per_tenant=4)], max_requests=4
        )
        gate = PoolGate("chat", core, clock=clock, metrics=AdmissionMetrics(CollectorRegistry()))
        gate.split = split
        self.gate = gate
        self.ledger = core.queues["batch"].ledger

    def pools(self) -> Mapping[str, PoolGate]:
        return {"chat": self.gate}


@pytest.fixture
async def redis(redis_port: int) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis(port=redis_port)
    await r.delete(fairshare_key("chat", "batch"))
    yield r
    await r.aclose()


async def test_each_process_counts_what_the_other_served(redis: aioredis.Redis) -> None:
    clock = Clock()
    p1, p2 = Process(clock), Process(clock)
    s1 = FairShare(p1, redis, clock=clock, registry=CollectorRegistry())
    s2 = FairShare(p2, redis, clock=clock, registry=CollectorRegistry())
    # the first exchange: each learns who the other serves (what came before is history)
    p1.gate.core.settle(clock(), "batch", "a", 100)
    p2.gate.core.settle(clock(), "batch", "b", 100)
    for s in (s1, s2, s1):
        await s.tick()
    # then a is served 3,000 tokens at process 1 and b 1,000 at process 2
    p1.gate.core.settle(clock(), "batch", "a", 3000)
    p2.gate.core.settle(clock(), "batch", "b", 1000)
    for s in (s1, s2, s1):
        clock.t += 0.5
        await s.tick()
    for p in (p1, p2):
        assert p.ledger.settled("a") >= 3000 and p.ledger.settled("b") >= 1000, p
    # each one's first 100 was served before the other had looked: history, not counted there
    assert p1.ledger.settled("b") == 1000 and p2.ledger.settled("a") == 3000
    # nothing counted twice by further exchanges
    for s in (s1, s2):
        await s.tick()
    assert (p1.ledger.settled("a"), p2.ledger.settled("b")) == (3100, 1100)
    totals = await redis.hgetall(fairshare_key("chat", "batch"))
    assert {k.decode(): float(v) for k, v in totals.items()} == {
        "a": 3100.0, "b": 1100.0, "a\x00n": 2.0, "b\x00n": 2.0,
    }  # fmt: skip
    # the other's requests taught each its cost per request
    assert p2.ledger.expected("a") == 3000 and p1.ledger.expected("b") == 1000


async def test_a_process_alone_shares_nothing_and_redis_gone_counts_its_own() -> None:
    clock = Clock()
    alone = Process(clock, split=1)
    dead = aioredis.Redis(port=free_port(), socket_connect_timeout=0.2)
    registry = CollectorRegistry()
    s = FairShare(alone, dead, clock=clock, registry=registry)
    alone.gate.core.settle(clock(), "batch", "a", 50)
    await s.tick()  # split 1: nobody to tell, Redis not asked
    assert (
        registry.get_sample_value("tokenweir_admission_fairshare_syncs_total", {"outcome": "error"})
        is None
    )
    shared = Process(clock)
    registry = CollectorRegistry()
    s2 = FairShare(shared, dead, clock=clock, registry=registry)
    shared.gate.core.settle(clock(), "batch", "a", 50)
    await s2.tick()
    assert (
        registry.get_sample_value("tokenweir_admission_fairshare_syncs_total", {"outcome": "error"})
        == 1
    )
    assert shared.ledger.settled("a") == 50
    await dead.aclose()


async def test_the_gauges_show_a_lanes_fairness_among_its_backlogged_tenants() -> None:
    clock = Clock()
    p = Process(clock, split=1)
    registry = CollectorRegistry()
    s = FairShare(p, None, clock=clock, registry=registry)
    core = p.gate.core
    for _ in range(4):  # the slots, taken
        core.offer(clock(), "batch", "x")
    for tenant in ("a", "b"):
        core.offer(clock(), "batch", tenant)  # queued: backlogged
    await s.tick()
    for _ in range(3):
        clock.t += 5.0
        core.settle(clock(), "batch", "a", 300)
        core.settle(clock(), "batch", "b", 100)
        await s.tick()
    labels = {"pool": "chat", "lane": "batch"}
    jain = registry.get_sample_value("tokenweir_admission_fairness_jain", labels)
    assert jain == pytest.approx(400**2 / (2 * (300**2 + 100**2)))
    assert registry.get_sample_value("tokenweir_admission_service_gap_tokens", labels) == 600
    assert registry.get_sample_value("tokenweir_admission_fairness_tenants", labels) == 2
