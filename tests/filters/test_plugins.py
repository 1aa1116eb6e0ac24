from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest

from filters.api import RouteInfo
from filters.budget import CachedBudget
from filters.errors import ClientError, ConfigError
from filters.plugins.identity.plugin import IdentityPlugin
from filters.plugins.lane.plugin import LanePlugin
from filters.plugins.prefix.plugin import PrefixPlugin
from filters.plugins.tokens.plugin import TokensPlugin
from filters.services import Services
from policy import Policy
from policy.reservation import ReservationPolicy
from policy.scheduling import PriorityScheduling
from tests.filters.conftest import ROUTE, FakeBudget, FakeClock, make_ctx, make_services


async def test_identity_maps_key_and_strips_internal_headers(services: Services) -> None:
    ctx = make_ctx()
    headers = {"authorization": "Bearer tw-demo-pro-key", "x-tokenweir-tenant": "demo-free"}
    r = await IdentityPlugin({}, services).request_headers(ctx, headers, False)
    assert r is not None
    assert (ctx.tenant, ctx.tier) == ("demo-pro", "pro")
    assert r.set_headers["x-tokenweir-tenant"] == "demo-pro"
    assert "x-tokenweir-tenant" in r.remove_headers and "authorization" in r.remove_headers


@pytest.mark.parametrize("auth", [None, "Bearer nope-nope-nope", "Basic abc", "Bearer "])
async def test_identity_rejects_missing_or_unknown_keys(
    services: Services, auth: str | None
) -> None:
    headers = {} if auth is None else {"authorization": auth}
    with pytest.raises(ClientError) as info:
        await IdentityPlugin({}, services).request_headers(make_ctx(), headers, False)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


async def test_identity_anonymous_when_not_required(services: Services) -> None:
    ctx = make_ctx()
    plugin = IdentityPlugin({"require": False, "anonymous_tier": "free"}, services)
    await plugin.request_headers(ctx, {}, False)
    assert (ctx.tenant, ctx.tier) == ("anonymous", "free")
    with pytest.raises(ConfigError):
        IdentityPlugin({"requir": True}, services)


class DictRedis:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {}
        self.fail = False
        self.delay = 0.0

    async def hgetall(self, name: str) -> dict[str, str]:
        if self.fail:
            raise ConnectionError("redis down")
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.data.get(name, {})

    async def smembers(self, name: str) -> set[str]:
        if self.fail:
            raise ConnectionError("redis down")
        return set()


async def test_keys_live_in_redis_win_and_revocation_applies_after_ttl(
    policy, clock: FakeClock
) -> None:
    from filters.keys import key_name

    redis = DictRedis()
    services = make_services(policy, clock, redis=redis)
    redis.data[key_name("brand-new-key")] = {"tenant": "demo-pro"}
    info = await services.keys.lookup("brand-new-key")
    assert info is not None and (info.tenant, info.tier) == ("demo-pro", None)
    redis.data[key_name("tw-demo-free-key")] = {"disabled": "1"}
    assert await services.keys.lookup("tw-demo-free-key") is None
    redis.data.pop(key_name("tw-demo-free-key"))
    assert await services.keys.lookup("tw-demo-free-key") is None  # cached
    clock.now += 1.5
    assert (await services.keys.lookup("tw-demo-free-key")).tenant == "demo-free"  # type: ignore[union-attr]
    redis.data[key_name("batch-only-key")] = {"tenant": "demo-pro", "lane": "batch"}
    ctx = make_ctx()
    await IdentityPlugin({}, services).request_headers(
        ctx, {"authorization": "Bearer batch-only-key"}, False
    )
    await LanePlugin({}, services).request_headers(ctx, {}, False)
    assert (ctx.tenant, ctx.tier, ctx.lane) == ("demo-pro", "pro", "batch")
    redis.fail = True
    clock.now += 1.5
    assert (await services.keys.lookup("tw-demo-pro-key")).tenant == "demo-pro"  # type: ignore[union-attr]
    redis.fail, redis.delay = False, 1.0  # a slow Redis: the policy file answers after 50 ms
    redis.data[key_name("tw-demo-pro-key")] = {"disabled": "1"}
    clock.now += 1.5
    assert (await services.keys.lookup("tw-demo-pro-key")).tenant == "demo-pro"  # type: ignore[union-attr]


class SlowBudget(FakeBudget):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        await asyncio.sleep(1.0)
        return 1


async def test_tokens_skips_a_slow_budget_read(policy, clock: FakeClock) -> None:
    services = make_services(_clamping(policy), clock, budget=SlowBudget({}))
    ctx = make_ctx(tenant="demo-free", tier="free")
    r = await TokensPlugin({"budget_timeout": 0.02}, services).request_body(
        ctx, _chat(max_tokens=999)
    )
    assert r is not None and r.body is not None and json.loads(r.body)["max_tokens"] == 256


async def test_tokens_clamps_on_a_cached_budget_without_reading(policy, clock: FakeClock) -> None:
    reader = FakeBudget({"demo-pro": 2500})
    budget = CachedBudget(reader, clock=clock, ttl=10.0)
    services = make_services(_clamping(policy), clock, budget=budget)
    plugin = TokensPlugin({}, services)
    clamps, reserves = [], []
    for _ in range(3):
        ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
        r = await plugin.request_body(ctx, _chat(max_tokens=1000))
        assert r is not None and ctx.prompt_tokens is not None
        clamps.append(json.loads(r.body)["max_tokens"] if r.body is not None else 1000)
        reserves.append(ctx.reserve)
    assert len(reader.calls) == 1  # the first clamp read, the others were answered by the cache
    assert clamps[:2] == [1000, 1000]
    # the cache was lowered by this process's two reservations: the third is clamped to the rest
    assert clamps[2] + ctx.prompt_tokens == 2500 - reserves[0] - reserves[1]


async def test_lane_from_tier_hint_and_route(services: Services) -> None:
    plugin = LanePlugin({}, services)
    free = make_ctx(tier="free")
    await plugin.request_headers(free, {"x-lane": "interactive"}, False)
    assert free.lane == "batch"  # the free tier may not use interactive
    pro = make_ctx(tier="pro")
    await plugin.request_headers(pro, {"x-lane": "batch"}, False)
    assert pro.lane == "batch"
    forced = make_ctx(tier="pro", route=RouteInfo(name="r", lane="batch"))
    r = await plugin.request_headers(forced, {}, False)
    assert forced.lane == "batch" and r is not None and r.clear_route_cache
    with pytest.raises(ClientError) as info:
        await LanePlugin({"on_forbidden": "reject"}, services).request_headers(
            make_ctx(tier="free"), {"x-lane": "interactive"}, False
        )
    assert info.value.status == 403


def _clamping(policy: Policy) -> Policy:
    """The policy with ``reservation.short_budget: clamp`` (max_tokens lowered to the budget)."""
    return replace(policy, reservation=ReservationPolicy(short_budget="clamp"))


def _chat(**kw: object) -> bytes:
    msgs = [{"role": "user", "content": "Tell me about weirs and rivers."}]
    return json.dumps({"model": "llama-3.1-8b", "messages": msgs, **kw}).encode()


async def test_tokens_clamps_to_tier_cap_and_sets_reservation(services: Services) -> None:
    ctx = make_ctx(tenant="demo-free", tier="free")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(max_tokens=5000))
    assert r is not None and r.body is not None
    sent = json.loads(r.body)
    assert sent["max_tokens"] == 256  # the free tier's cap
    assert int(r.set_headers["x-tokenweir-reserve"]) == ctx.prompt_tokens + 256
    assert r.set_headers["content-length"] == str(len(r.body))
    assert r.set_headers["x-tokenweir-model"] == "llama-3.1-8b"


async def test_tokens_sets_max_tokens_when_absent_and_keeps_small_values(
    services: Services,
) -> None:
    plugin = TokensPlugin({}, services)
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    r = await plugin.request_body(ctx, _chat())
    assert r is not None and r.body is not None and json.loads(r.body)["max_tokens"] == 4096
    ctx2 = make_ctx(tenant="demo-pro", tier="pro")
    r2 = await plugin.request_body(ctx2, _chat(max_tokens=10))
    assert r2 is not None and r2.body is None  # nothing to rewrite
    assert ctx2.reserve == ctx2.prompt_tokens + 10  # type: ignore[operator]


async def test_tokens_clamps_to_remaining_budget(policy, clock: FakeClock) -> None:
    budget = FakeBudget({"demo-pro": 300})
    services = make_services(_clamping(policy), clock, budget=budget)
    ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(max_tokens=1000))
    assert r is not None and r.body is not None
    assert json.loads(r.body)["max_tokens"] == 300 - ctx.prompt_tokens  # type: ignore[operator]
    assert ctx.reserve == 300
    assert budget.calls == [("demo-pro", "llama-3.1-8b", "interactive")]
    empty = make_ctx(tenant="demo-pro", tier="pro")
    budget.left["demo-pro"] = 0
    r = await TokensPlugin({}, services).request_body(empty, _chat(max_tokens=1000))
    assert r is not None and r.body is not None and json.loads(r.body)["max_tokens"] == 1


async def test_tokens_forces_include_usage_on_streams(services: Services) -> None:
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(stream=True, max_tokens=8))
    assert r is not None and r.body is not None
    assert json.loads(r.body)["stream_options"] == {"include_usage": True}
    assert ctx.stream and not ctx.client_wants_usage


async def test_tokens_generate_sets_max_new_tokens(services: Services) -> None:
    ctx = make_ctx(path="/generate", tenant="demo-free", tier="free")
    r = await TokensPlugin({}, services).request_body(ctx, b'{"text":"hello world"}')
    assert r is not None and r.body is not None
    assert json.loads(r.body)["sampling_params"]["max_new_tokens"] == 256
    assert ctx.model == "llama-3.1-8b"  # the route's pool model


async def test_tokens_rejects_content_type_and_size(services: Services) -> None:
    plugin = TokensPlugin({"max_body_bytes": 2048}, services)
    with pytest.raises(ClientError) as info:
        await plugin.request_headers(make_ctx(), {"content-type": "text/plain"}, False)
    assert info.value.status == 415
    with pytest.raises(ClientError) as info:
        await plugin.request_headers(make_ctx(), {"content-length": "4096"}, False)
    assert info.value.status == 413
    with pytest.raises(ClientError) as info:
        await plugin.request_body(make_ctx(), b" " * 3000)
    assert info.value.status == 413


async def test_tokens_answers_a_post_without_body_itself(services: Services) -> None:
    # Envoy skips the body phase when there is no body: the request would reach the backend
    plugin = TokensPlugin({}, services)
    with pytest.raises(ClientError, match="empty") as info:
        await plugin.request_headers(make_ctx(), {"content-length": "0"}, True)
    assert info.value.status == 400
    get = make_ctx(path="/v1/models")
    get.method = "GET"
    assert await plugin.request_headers(get, {}, True) is None


async def test_prefix_hash_shared_system_prompt_does_not_collapse(services: Services) -> None:
    plugin = PrefixPlugin({}, services)
    system = {"role": "system", "content": "You are a helpful assistant."}

    async def hash_of(messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": "m", "messages": messages}).encode()
        r = await plugin.request_body(make_ctx(), body)
        assert r is not None
        return r.set_headers["x-prefix-hash"]

    a1 = await hash_of([system, {"role": "user", "content": "Alice asks about rivers"}])
    b1 = await hash_of([system, {"role": "user", "content": "Bob asks about taxes"}])
    a2 = await hash_of(
        [
            system,
            {"role": "user", "content": "Alice asks about rivers"},
            {"role": "assistant", "content": "Rivers flow."},
            {"role": "user", "content": "And weirs?"},
        ]
    )
    assert a1 != b1  # same system prompt, different conversations
    assert a1 == a2  # one conversation, later turn
    doc = "lorem ipsum dolor " * 400  # a long shared prefix beyond K tokens
    d1 = await hash_of([{"role": "user", "content": doc + "question one"}])
    d2 = await hash_of([{"role": "user", "content": doc + "question two"}])
    assert d1 == d2


async def test_unknown_plugin_settings_are_config_errors(services: Services) -> None:
    for cls in (TokensPlugin, PrefixPlugin, LanePlugin):
        with pytest.raises(ConfigError):
            cls({"bogus": 1}, services)
    assert ROUTE.rate_limited


async def test_slow_budget_reads_are_logged_once_per_interval_not_per_request(
    policy, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    services = make_services(_clamping(policy), clock, budget=SlowBudget({}))
    plugin = TokensPlugin({"budget_timeout": 0.001}, services)
    with caplog.at_level(logging.WARNING, logger="filters.plugins.tokens.plugin"):
        await asyncio.gather(
            *(
                plugin.request_body(make_ctx(tenant="demo-free", tier="free"), _chat())
                for _ in range(20)
            )
        )
    assert len([r for r in caplog.records if "budget" in r.getMessage()]) == 1
    assert services.metrics.redis_errors._value.get() == 20


async def test_tokens_removes_a_client_priority_where_the_pool_does_not_rank(
    services: Services,
) -> None:
    # the gateway, not the client, ranks requests: a priority a client slips through is dropped
    plugin = TokensPlugin({"extra_fields": ["priority"]}, services)
    ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
    r = await plugin.request_body(ctx, _chat(max_tokens=10, priority=1_000_000))
    assert r is not None and r.body is not None
    assert "priority" not in json.loads(r.body)


def _ranked(policy: Policy, *, low_first: bool = False) -> Policy:
    chat = replace(
        policy.pools["chat"],
        priority_scheduling=PriorityScheduling(enabled=True, low_values_first=low_first),
    )
    return replace(policy, pools={**policy.pools, "chat": chat})


@pytest.mark.parametrize("low_first", [False, True])
async def test_tokens_writes_the_lanes_priority_where_the_pool_ranks_by_it(
    policy: Policy, clock: FakeClock, low_first: bool
) -> None:
    services = make_services(_ranked(policy, low_first=low_first), clock)
    plugin = TokensPlugin({"extra_fields": ["priority"]}, services)
    sent = {}
    for lane in ("interactive", "batch"):
        ctx = make_ctx(tenant="demo-pro", tier="pro", lane=lane)
        # a client's own priority never survives: the lane decides
        r = await plugin.request_body(ctx, _chat(max_tokens=10, priority=-5))
        assert r is not None and r.body is not None
        sent[lane] = json.loads(r.body)["priority"]
        assert r.set_headers["content-length"] == str(len(r.body))
    sign = -1 if low_first else 1
    assert sent == {"interactive": 100 * sign, "batch": 0}
    ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
    body = _chat(max_tokens=10, priority=100 * sign)
    r = await TokensPlugin({"extra_fields": ["priority"]}, services).request_body(ctx, body)
    assert r is not None and r.body is None  # already right: no rewrite
