"""Money budgets (quota ``usd``): reserved at the worst-case price, settled with the real price,
denied with Retry-After until the window resets, and live-editable like token quotas. On the
twin (MemoryStore) and on real Redis (the Lua scripts)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from envoy.service.ratelimit.v3 import rls_pb2

from policy import Policy, load_policy_text
from quota.config import parse_quota_fields
from quota.cost import cost_usd, micro_usd, worst_case_micro_usd
from quota.keys import config_key
from ratelimit_service.decider import Decider, DeciderSettings
from ratelimit_service.directory import QuotaDirectory
from ratelimit_service.metrics import Metrics
from ratelimit_service.store import MemoryStore, RedisStore
from tests.ratelimit_service.rls import descriptor

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

YAML = """
version: 1
pools: {chat: {models: [big], endpoints: [127.0.0.1:30001]}}
prices:
  big: {prompt: 1.0, cached: 0.5, completion: 2.0}   # USD per 1k tokens
tiers:
  paid:
    quotas:
      tokens: {burst: 100000, refill_per_second: 100}
      usd: {per_day: 1.0, per_month: 20}
tenants:
  acme: {tier: paid, cost_center: research}
  solo: {tier: paid, quotas: {usd: {per_day: 0.5}}}
"""
T0 = 1_800_000_000.0  # 08:00:00 UTC: 57,600 s until the next day


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def req(tenant: str, hits: int, rid: str, phase: str = "reserve", usd: str | None = None) -> Any:
    entries = {"tenant": tenant, "model": "big", "lane": "interactive", "request_id": rid}
    if usd is not None:
        entries["usd"] = usd
    entries["phase"] = phase
    return rls_pb2.RateLimitRequest(domain="tokenweir", descriptors=[descriptor(entries, hits)])


@pytest.fixture
def policy() -> Policy:
    return load_policy_text(YAML)


def make(policy: Policy, store: Any = None, live: dict[str, dict[str, str]] | None = None) -> Any:
    clock = Clock()
    fetch = None
    if live is not None:

        async def fetch(key: str) -> dict[str, str]:
            return dict(live.get(key, {}))

    metrics = Metrics()
    metrics.configure(policy)
    d = Decider(
        DeciderSettings(),
        directory=QuotaDirectory(policy, fetch, ttl=0.0, clock=clock),
        store=store if store is not None else MemoryStore(),
        health=None,
        metrics=metrics,
        clock=clock,
    )
    return d, clock


def error(resp: Any) -> dict[str, Any]:
    return json.loads(resp.raw_body)["error"]


def retry_after(resp: Any) -> str:
    return {h.key: h.value for h in resp.response_headers_to_add}["retry-after"]


def test_prices_and_budgets_come_from_the_policy(policy: Policy) -> None:
    assert policy.tenants["acme"].cost_center == "research"
    assert cost_usd(policy, "big", prompt=1000, completion=500, cached=400) == pytest.approx(
        0.6 + 0.2 + 1.0
    )
    assert micro_usd(policy, "big", 1000, 500, 400) == 1_800_000
    assert worst_case_micro_usd(policy, "big", 400) == 800_000  # every token at $2/1k
    assert worst_case_micro_usd(policy, "unpriced", 400) == 0
    specs, problems = parse_quota_fields({"usd.per_day": "2.5", "usd.burst": "9"})
    assert specs["usd"].per_day == 2_500_000 and problems == [
        "usd.burst: a usd budget has per_minute, per_hour, per_day, per_month (USD) and shadow"
    ]


async def test_reserve_settle_and_reject_with_retry_after(policy: Policy) -> None:
    d, _ = make(policy)
    # 400 tokens reserve $0.80 of the $1.00 day
    assert (await d.decide(req("acme", 400, "a"))).overall_code == OK
    r = await d.decide(req("acme", 400, "b"))
    assert r.overall_code == OVER
    err = error(r)
    assert err["type"] == "usd" and err["quota"] == "usd.day"
    assert "$1.000000" in err["message"] and "$0.200000" in err["message"]
    assert retry_after(r) == "57600"  # the day's budget is back at midnight UTC
    # the request really cost $0.15: $0.65 goes back, so $0.85 is free again
    await d.decide(req("acme", 120, "a", phase="settle", usd="150000"))
    assert (await d.decide(req("acme", 400, "b"))).overall_code == OK
    assert (await d.decide(req("acme", 30, "c"))).overall_code == OVER  # 0.95 + 0.06 > 1
    # a settle without a price (no usage seen) charges the worst case of the tokens it names
    await d.decide(req("acme", 0, "b", phase="settle"))  # upstream error: nothing produced
    assert (await d.decide(req("acme", 400, "c"))).overall_code == OK
    m = d.metrics.registry
    assert (
        m.get_sample_value(
            "tokenweir_quota_remaining", {"tenant": "acme", "quota": "usd", "unit": "day"}
        )
        == 1_000_000 - 150_000 - 800_000
    )


async def test_tenant_budget_overrides_its_tier(policy: Policy) -> None:
    d, _ = make(policy)
    r = await d.decide(req("solo", 300, "a"))  # $0.60 > its own $0.50 a day
    assert r.overall_code == OVER and error(r)["quota"] == "usd.day"
    assert (await d.decide(req("solo", 200, "b"))).overall_code == OK


async def test_live_edit_changes_the_budget_at_once(policy: Policy) -> None:
    live: dict[str, dict[str, str]] = {}
    d, _ = make(policy, live=live)
    assert (await d.decide(req("acme", 100, "a"))).overall_code == OK  # $0.20
    live[config_key("acme")] = {"usd.per_day": "0.25"}
    r = await d.decide(req("acme", 100, "b"))
    assert r.overall_code == OVER and error(r)["quota"] == "usd.day"
    live[config_key("acme")] = {"usd.per_day": "none"}  # the month's $20 is what is left
    assert (await d.decide(req("acme", 100, "b"))).overall_code == OK


async def test_lua_and_twin_settle_money_alike(policy: Policy, redis_port: int) -> None:
    client = aioredis.Redis(port=redis_port)
    await client.flushdb()
    try:
        redis_d, _ = make(policy, store=RedisStore(client))
        twin_d, _ = make(policy)
        for d in (redis_d, twin_d):
            assert (await d.decide(req("acme", 400, "a"))).overall_code == OK
            await d.decide(req("acme", 120, "a", phase="settle", usd="150000"))
            assert (await d.decide(req("acme", 400, "b"))).overall_code == OK
        for d in (redis_d, twin_d):
            r = await d.decide(req("acme", 30, "c"))
            assert r.overall_code == OVER and r.statuses[0].limit_remaining == 50_000
    finally:
        await client.aclose()
