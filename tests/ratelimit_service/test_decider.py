"""The decision core on fakes (MemoryStore as the store, an injected clock): no network."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from policy import Policy, load_policy_text
from ratelimit_service.decider import Decider, DeciderSettings
from ratelimit_service.directory import QuotaDirectory
from ratelimit_service.errors import StoreUnavailable
from ratelimit_service.health import RedisHealth
from ratelimit_service.limiter import Check, ReserveResult, SettleResult
from ratelimit_service.metrics import Metrics
from ratelimit_service.store import MemoryStore
from tests.ratelimit_service import rls

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
YAML = """
version: 1
pools: {chat: {models: [big], endpoints: [127.0.0.1:30001]}}
services:
  inv: {endpoints: [127.0.0.1:18090], rate_limit: {burst: 2, refill_per_second: 1}}
tiers:
  free:
    quotas:
      tokens: {burst: 1000, refill_per_second: 10, per_day: 5000}
  huge:
    quotas:
      tokens: {burst: 900000000, refill_per_second: 1, per_month: 999999999}
  shadowed:
    quotas:
      tokens: {burst: 100, refill_per_second: 0, shadow: true}
tenants:
  acme: {tier: free}
  big: {tier: huge}
  shadow: {tier: shadowed}
  free-for-all: {tier: nonexistent-is-caught-elsewhere}
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


class BrokenStore:
    """A store whose Redis is gone: every call fails."""

    def __init__(self) -> None:
        self.calls = 0

    async def reserve(
        self, record: str, has: bool, checks: list[Check], now: int, ttl: int, trace: object = None
    ) -> ReserveResult:
        self.calls += 1
        raise StoreUnavailable("connection refused")

    async def settle(self, record: str, actual: int, now: int) -> SettleResult:
        self.calls += 1
        raise StoreUnavailable("connection refused")


@pytest.fixture
def policy() -> Policy:
    text = YAML.replace("  free-for-all: {tier: nonexistent-is-caught-elsewhere}\n", "")
    return load_policy_text(text)


def make(policy: Policy, store: Any = None, **kw: Any) -> tuple[Decider, Clock]:
    clock = Clock()
    metrics = Metrics()
    health = RedisHealth(lambda: _never(), metrics, min_backoff=60) if store is not None else None
    d = Decider(
        DeciderSettings(**kw),
        directory=QuotaDirectory(policy, None),
        store=store if store is not None else MemoryStore(),
        health=health,
        metrics=metrics,
        clock=clock,
    )
    return d, clock


async def _never() -> None:
    raise OSError("down")


def body(resp: rls_pb2.RateLimitResponse) -> dict[str, Any]:
    return json.loads(resp.raw_body)["error"]


def headers(resp: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {h.key: h.value for h in resp.response_headers_to_add}


async def test_admits_until_the_bucket_is_empty_then_explains(policy: Policy) -> None:
    d, clock = make(policy)
    r = await d.decide(rls.llm("acme", 600, rid="a"))
    assert r.overall_code == OK
    assert r.statuses[0].limit_remaining == 400
    r = await d.decide(rls.llm("acme", 500, rid="b"))
    assert r.overall_code == OVER
    err = body(r)
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
    assert err["quota"] == "tokens.bucket" and "acme" in err["message"]
    assert headers(r)["retry-after"] == "10"  # 100 tokens missing at 10 tokens/s
    assert headers(r)["content-type"] == "application/json"
    st = r.statuses[0]
    assert (st.current_limit.requests_per_unit, st.limit_remaining) == (1000, 400)
    assert st.duration_until_reset.seconds == 10
    clock.t += 10
    assert (await d.decide(rls.llm("acme", 500, rid="b"))).overall_code == OK


async def test_settle_refunds_once(policy: Policy) -> None:
    d, _ = make(policy)
    assert (await d.decide(rls.llm("acme", 900, rid="x"))).overall_code == OK
    assert (await d.decide(rls.llm("acme", 900, rid="y"))).overall_code == OVER
    await d.decide(rls.llm("acme", 100, rid="x", phase="settle"))
    await d.decide(rls.llm("acme", 100, rid="x", phase="settle"))  # repeated: ignored
    r = await d.decide(rls.llm("acme", 900, rid="y"))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 0
    samples = {
        s.name + str(s.labels): s.value for m in d.metrics.registry.collect() for s in m.samples
    }
    assert samples["tokenweir_ratelimit_tokens_total{'kind': 'refunded'}"] == 800
    assert samples["tokenweir_ratelimit_settles_total{'result': 'not_found'}"] == 1


async def test_settle_charges_extra_when_usage_exceeds_reservation(policy: Policy) -> None:
    d, _ = make(policy)
    await d.decide(rls.llm("acme", 100, rid="x"))
    await d.decide(rls.llm("acme", 700, rid="x", phase="settle"))  # 600 more than reserved
    r = await d.decide(rls.llm("acme", 301, rid="y"))
    assert r.overall_code == OVER and r.statuses[0].limit_remaining == 300


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (rls.llm("acme", 1, domain="other"), "unknown_domain"),
        (rls_pb2.RateLimitRequest(domain="tokenweir"), "missing_descriptors"),
        (rls.llm("acme", 10**12), "invalid_hits_addend"),
        (rls.llm("nobody", 10), "unknown_tenant"),
        (rls.llm("", 10), "missing_tenant"),
        (rls.llm("acme", 10, phase="weird"), "invalid_rate_limit_request"),
    ],
)
async def test_bad_input_gets_a_defined_answer(
    policy: Policy, request_: rls_pb2.RateLimitRequest, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    d, _ = make(policy)
    r = await d.decide(request_)
    assert r.overall_code == OVER
    assert body(r)["code"] == code
    assert code in caplog.text


async def test_shadow_quota_reports_but_never_denies(policy: Policy) -> None:
    d, _ = make(policy)
    assert (await d.decide(rls.llm("shadow", 80, rid="1"))).overall_code == OK
    r = await d.decide(rls.llm("shadow", 80, rid="2"))
    assert r.overall_code == OK
    assert headers(r)["x-tokenweir-shadow-over-limit"] == "tokens.bucket"
    denials = d.metrics.shadow_denials.labels("tokens.bucket")._value.get()
    assert denials == 1


class LiveFields:
    """Just enough of a Redis client for the directory: live quota hashes."""

    def __init__(self, fields: dict[str, dict[str, str]]) -> None:
        self.fields = fields

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        return {k.encode(): v.encode() for k, v in self.fields.get(key, {}).items()}


async def test_uint32_fields_are_clamped(policy: Policy) -> None:
    d, _ = make(policy)
    live = {"tw:{big}:quota": {"tokens.burst": "10000000000000", "tokens.per_month": "none"}}
    d.directory = QuotaDirectory(policy, LiveFields(live).hgetall)
    r = await d.decide(rls.llm("big", 5))
    st = r.statuses[0]
    assert r.overall_code == OK
    assert st.current_limit.requests_per_unit == 2**32 - 1 and st.limit_remaining == 2**32 - 1
    r.SerializeToString()


async def test_request_larger_than_the_burst_never_fits(policy: Policy) -> None:
    d, _ = make(policy)
    r = await d.decide(rls.llm("acme", 1001))
    assert r.overall_code == OVER
    assert "retry-after" not in headers(r)
    assert body(r)["param"] == "max_tokens"


async def test_service_request_counts_per_client(policy: Policy) -> None:
    d, _ = make(policy)
    codes = [(await d.decide(rls.service("inv", "10.0.0.1"))).overall_code for _ in range(3)]
    assert codes == [OK, OK, OVER]
    assert (await d.decide(rls.service("inv", "10.0.0.2"))).overall_code == OK


async def test_redis_down_fail_open_uses_a_local_share(policy: Policy) -> None:
    store = BrokenStore()
    d, _ = make(policy, store, replicas=2, failure_mode="open")
    assert (await d.decide(rls.llm("acme", 500, rid="1"))).overall_code == OK  # share: 500
    assert (await d.decide(rls.llm("acme", 1, rid="2"))).overall_code == OVER
    assert store.calls == 1  # the circuit opened: the second call did not wait for Redis
    await d.decide(rls.llm("acme", 100, rid="1", phase="settle"))  # settled locally, once
    assert (await d.decide(rls.llm("acme", 400, rid="3"))).overall_code == OK
    assert d.metrics.fallbacks.labels("open")._value.get() == 3
    assert d.health is not None
    await d.health.aclose()


async def test_redis_down_fail_closed_denies(policy: Policy) -> None:
    d, _ = make(policy, BrokenStore(), failure_mode="closed")
    r = await d.decide(rls.llm("acme", 5))
    assert r.overall_code == OVER
    assert body(r)["code"] == "quota_unavailable" and headers(r)["retry-after"] == "1"
    assert d.health is not None
    await d.health.aclose()


async def test_a_429_is_a_false_reject_when_the_requests_in_flight_refund_what_it_lacked(
    policy: Policy,
) -> None:
    d, clock = make(policy)
    metric = "tokenweir_ratelimit_false_rejects_total"
    assert (await d.decide(rls.llm("acme", 900, rid="x"))).overall_code == OK
    assert (await d.decide(rls.llm("acme", 300, rid="y"))).overall_code == OVER  # lacked 200
    assert (await d.decide(rls.llm("acme", 950, rid="z"))).overall_code == OVER  # lacked 850
    clock.t += 1  # (10 tokens refilled meanwhile: not a refund)
    await d.decide(rls.llm("acme", 600, rid="x", phase="settle"))  # 300 unused: room for y
    value = d.metrics.registry.get_sample_value
    assert value(metric, {"tenant": d.metrics.tenant_label("acme")}) == 1
    # z lacked more than any refund within the horizon: a true reject, forgotten after it
    clock.t += 120
    assert (await d.decide(rls.llm("acme", 100, rid="w"))).overall_code == OK
    await d.decide(rls.llm("acme", 0, rid="w", phase="settle"))
    assert value(metric, {"tenant": d.metrics.tenant_label("acme")}) == 1


def test_false_rejects_follow_each_429_once_and_forget_old_ones() -> None:
    from ratelimit_service.false_rejects import FalseRejects

    f = FalseRejects(horizon=60.0, max_open=3)
    f.rejected("a", 0.0, 100)
    f.rejected("a", 1.0, 300)
    f.rejected("b", 1.0, 50)
    f.rejected("b", 1.0, 50)  # past max_open: not followed
    f.rejected("a", 1.0, 0)  # lacked nothing (not a token shortfall): not followed
    assert f.refunded("a", 2.0, 150) == 1  # the first; the second has 150 of its 300
    assert f.refunded("a", 3.0, 150) == 1
    assert f.refunded("a", 4.0, 1000) == 0  # each counted once
    assert f.refunded("b", 70.0, 100) == 0  # b's 429 is past the horizon
    assert f.refunded("nobody", 1.0, 10) == 0
