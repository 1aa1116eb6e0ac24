"""Regression tests from a review of the request path (budget bypasses found by reading it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2

from controlplane.translate.ext_proc import EXT_PROC_FILTER, ext_proc_per_route
from filters.bodies import parse_request
from filters.errors import ClientError
from filters.plugins.tokens.plugin import TokensPlugin
from filters.plugins.usage.plugin import UsagePlugin
from filters.services import Services
from policy import Policy
from policy.model import PluginRef, Route, RouteFilters, RouteMatch, RouteRateLimit
from tests.filters.conftest import ROUTE, FakeClock, make_ctx, make_services


def _chat(**kw: object) -> bytes:
    msgs = [{"role": "user", "content": "Tell me about weirs and rivers."}]
    return json.dumps({"model": "llama-3.1-8b", "messages": msgs, **kw}).encode()


def _backend_max_tokens(body: dict[str, object]) -> object:
    """What SGLang, vLLM and the emulator use: max_completion_tokens first, then max_tokens."""
    return body.get("max_completion_tokens") or body.get("max_tokens")


async def test_both_max_token_fields_are_clamped(services: Services) -> None:
    # a small max_tokens must not hide a huge max_completion_tokens from the clamp
    for kw in (
        {"max_tokens": 10, "max_completion_tokens": 5000},
        {"max_completion_tokens": 5000, "max_tokens": 10},
        {"max_tokens": 5000, "max_completion_tokens": 10},
    ):
        ctx = make_ctx(tenant="demo-free", tier="free")
        r = await TokensPlugin({}, services).request_body(ctx, _chat(**kw))
        assert r is not None
        sent = json.loads(r.body) if r.body is not None else json.loads(_chat(**kw))
        used = _backend_max_tokens(sent)
        assert isinstance(used, int) and used <= 256, (kw, sent)  # the free tier's cap
        assert ctx.reserve is not None and ctx.prompt_tokens is not None
        assert ctx.reserve - ctx.prompt_tokens >= used, (kw, sent)
        assert all(sent[k] <= 256 for k in ("max_tokens", "max_completion_tokens")), sent


async def test_a_model_the_route_does_not_serve_is_refused(services: Services) -> None:
    # the model name keys the models.<name> quota: an invented one would skip it
    ctx = make_ctx(tenant="demo-free", tier="free")
    with pytest.raises(ClientError) as info:
        await TokensPlugin({}, services).request_body(ctx, _chat(model="llama-3.1-8b-x"))
    assert (info.value.status, info.value.code, info.value.param) == (
        404,
        "model_not_found",
        "model",
    )
    ok = make_ctx(tenant="demo-free", tier="free")
    r = await TokensPlugin({}, services).request_body(ok, _chat(max_tokens=8))
    assert r is not None and ok.model == "llama-3.1-8b"
    gen = make_ctx(path="/generate", tenant="demo-free", tier="free")
    await TokensPlugin({}, services).request_body(gen, b'{"text":"hi"}')  # no model: the pool's
    assert gen.model == "llama-3.1-8b"


def _routed_by_model(policy: Policy) -> Policy:
    gw = policy.gateways["edge"]
    extra = replace(gw.routes[0], name="by-model", match=RouteMatch(prefix="/v1/", model="m2"))
    return replace(
        policy, gateways={**policy.gateways, "edge": replace(gw, routes=(extra, *gw.routes))}
    )


async def test_a_model_another_route_matches_on_is_accepted(
    policy: Policy, clock: FakeClock
) -> None:
    services = make_services(_routed_by_model(policy), clock)
    ctx = make_ctx(tenant="demo-free", tier="free")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(model="m2", max_tokens=8))
    assert r is not None and ctx.model == "m2"
    # but not from an unmetered route: Envoy keeps the first match's filters, so the metered
    # route's rate limit would not run (tests/integration/test_request_path_review.py)
    assert services.policy.gateways["edge"].routes[0].rate_limit is not None
    unmetered = make_ctx(route=replace(ROUTE, rate_limited=False), tenant="demo-free", tier="free")
    with pytest.raises(ClientError) as info:
        await TokensPlugin({}, services).request_body(unmetered, _chat(model="m2", max_tokens=8))
    assert info.value.status == 404


def test_a_metered_pool_route_never_fails_open() -> None:
    # with the filter server unreachable, Envoy would pass the client's own x-tokenweir-* headers
    # to the rate-limit descriptors (tests/integration/test_request_path_review.py shows it)
    open_chain = RouteFilters(plugins=(PluginRef("identity"),), failure_mode="open")
    metered = Route(name="llm", pool="chat", rate_limit=RouteRateLimit(), filters=open_chain)
    unmetered = replace(metered, rate_limit=None)
    service = Route(name="svc", service="inv", rate_limit=RouteRateLimit(), filters=open_chain)

    def allow(route: Route) -> bool:
        cfg = ext_proc_pb2.ExtProcPerRoute()
        ext_proc_per_route(route)[EXT_PROC_FILTER].Unpack(cfg)
        return cfg.overrides.failure_mode_allow.value

    assert (allow(metered), allow(unmetered), allow(service)) == (False, True, True)
    closed = replace(metered, filters=replace(open_chain, failure_mode="closed"))
    assert allow(replace(closed, rate_limit=None)) is False


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def test_per_chunk_usage_settles_the_final_count(services: Services) -> None:
    # stream_options.continuous_usage_stats (SGLang, vLLM) puts a running usage on every chunk:
    # the first one (1 completion token) must not be what the request is charged
    chunks = [
        _ev({"choices": [{"delta": {"content": "a"}}], "usage": _u(1)}),
        _ev({"choices": [{"delta": {"content": "b"}}], "usage": _u(2)}),
        _ev({"choices": [{"delta": {}, "finish_reason": "length"}], "usage": _u(50)}),
        _ev({"choices": [], "usage": _u(50)}),
        b"data: [DONE]\n\n",
    ]
    for wants_usage in (True, False):
        opts = {"include_usage": True} if wants_usage else {}
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}],
                "stream": True, "stream_options": {**opts, "continuous_usage_stats": True}}  # fmt: skip
        ctx = make_ctx(tenant="demo-pro", model="llama-3.1-8b")
        ctx.body = parse_request("chat", json.dumps(body).encode())
        ctx.stream, ctx.client_wants_usage = True, wants_usage
        plugin = UsagePlugin({}, services)
        meta: dict[str, object] = {}
        for i, c in enumerate(chunks):
            r = await plugin.response_chunk(ctx, c, i == len(chunks) - 1)
            if r is not None:
                meta.update(r.metadata)  # Envoy keeps the last value of a metadata key
        await plugin.stream_end(ctx)
        assert meta["settle_tokens"] == 60, wants_usage
        assert ctx.usage is not None and ctx.usage.completion_tokens == 50


def _u(completion: int) -> dict[str, int]:
    return {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion}
