"""The tokens plugin's reservation (policy ``reservation``) and its answers to bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from filters.api import Usage
from filters.errors import ClientError
from filters.output_lengths import bucket_of, upper_edge
from filters.plugins.tokens.plugin import TokensPlugin
from policy import Policy
from policy.reservation import ReservationPolicy
from tests.filters.conftest import ROUTE, FakeBudget, FakeClock, make_ctx, make_services

STOPPING = replace(ROUTE, stops_at_budget=True)  # a route whose usage plugin stops at the budget


def _chat(**kw: object) -> bytes:
    msgs = [{"role": "user", "content": "Tell me about weirs and rivers."}]
    return json.dumps({"model": "llama-3.1-8b", "messages": msgs, **kw}).encode()


async def _settle(plugin: TokensPlugin, tenant: str, completion: int) -> None:
    ctx = make_ctx(tenant=tenant, tier="pro", model="llama-3.1-8b")
    ctx.usage = Usage(prompt_tokens=10, completion_tokens=completion)
    await plugin.stream_end(ctx)


async def test_a_history_of_short_answers_lowers_the_reservation(
    policy: Policy, clock: FakeClock
) -> None:
    budget = FakeBudget({"demo-pro": 10})  # would clamp to nothing: reject mode never reads it
    services = make_services(policy, clock, budget=budget)
    plugin = TokensPlugin({}, services)
    first = make_ctx(route=STOPPING, tenant="demo-pro", tier="pro")
    r = await plugin.request_body(first, _chat(max_tokens=1024))
    assert r is not None and r.body is None  # max_tokens kept: nothing to rewrite
    assert first.reserve == first.prompt_tokens + 1024  # type: ignore[operator]  # no history
    for n in range(19):
        await _settle(plugin, "demo-pro", 40 + n)
    ctx = make_ctx(route=STOPPING, tenant="demo-pro", tier="pro")
    await plugin.request_body(ctx, _chat(max_tokens=1024))
    assert ctx.reserve == ctx.prompt_tokens + 1024  # type: ignore[operator]  # 19 < min_samples
    await _settle(plugin, "demo-pro", 100)
    ctx = make_ctx(route=STOPPING, tenant="demo-pro", tier="pro")
    await plugin.request_body(ctx, _chat(max_tokens=1024))
    p95 = upper_edge(bucket_of(58))  # the 19th of 20 answers
    assert ctx.reserve == ctx.prompt_tokens + p95  # type: ignore[operator]
    assert ctx.max_tokens == 1024 and budget.calls == []
    # a small max_tokens is reserved whole; a new tenant gets the model's pooled lengths
    small = make_ctx(route=STOPPING, tenant="demo-pro", tier="pro")
    await plugin.request_body(small, _chat(max_tokens=20))
    assert small.reserve == small.prompt_tokens + 20  # type: ignore[operator]
    other = make_ctx(route=STOPPING, tenant="demo-free", tier="free")
    await plugin.request_body(other, _chat(max_tokens=200))
    assert other.reserve == other.prompt_tokens + p95  # type: ignore[operator]
    m = services.metrics.reservations
    assert m.labels("tenant")._value.get() == 1 and m.labels("pooled")._value.get() == 1


async def test_a_route_that_does_not_stop_at_the_budget_reserves_the_worst_case(
    policy: Policy, clock: FakeClock
) -> None:
    """An answer longer than a learned reservation would overshoot the budget where nothing
    stops it in the stream: such a route reserves ``max_tokens``, whatever was learned."""
    services = make_services(policy, clock)
    plugin = TokensPlugin({}, services)
    for _ in range(30):
        await _settle(plugin, "demo-pro", 5)
    ctx = make_ctx(tenant="demo-pro", tier="pro")  # the usage plugin meters, stops nothing
    await plugin.request_body(ctx, _chat(max_tokens=1024))
    assert ctx.reserve == ctx.prompt_tokens + 1024  # type: ignore[operator]
    assert services.metrics.reservations.labels("no_stop")._value.get() == 1
    guarded = make_ctx(route=STOPPING, tenant="demo-pro", tier="pro")
    await plugin.request_body(guarded, _chat(max_tokens=1024))
    assert guarded.reserve < guarded.prompt_tokens + 1024  # type: ignore[operator]


async def test_reserving_max_tokens_ignores_what_was_learned(
    policy: Policy, clock: FakeClock
) -> None:
    policy = replace(policy, reservation=ReservationPolicy(output="max_tokens"))
    services = make_services(policy, clock)
    plugin = TokensPlugin({}, services)
    for _ in range(30):
        await _settle(plugin, "demo-pro", 5)
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    await plugin.request_body(ctx, _chat(max_tokens=1024))
    assert ctx.reserve == ctx.prompt_tokens + 1024  # type: ignore[operator]


async def test_clamp_mode_lowers_max_tokens_to_the_budget(policy: Policy, clock: FakeClock) -> None:
    budget = FakeBudget({"demo-pro": 300})
    clamping = replace(policy, reservation=ReservationPolicy(short_budget="clamp"))
    services = make_services(clamping, clock, budget=budget)
    ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(max_tokens=1000))
    assert r is not None and r.body is not None
    assert json.loads(r.body)["max_tokens"] == 300 - ctx.prompt_tokens  # type: ignore[operator]
    # the same request in reject mode keeps its max_tokens (the rate-limit service decides)
    services = make_services(policy, clock, budget=budget)
    ctx = make_ctx(tenant="demo-pro", tier="pro", lane="interactive")
    r = await TokensPlugin({}, services).request_body(ctx, _chat(max_tokens=1000))
    assert r is not None and r.body is None and ctx.max_tokens == 1000


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (_chat(max_tokens=-5), 400, "max_tokens"),
        (_chat(max_tokens=0), 400, "max_tokens"),
        (_chat(max_tokens=10**12), 400, "max_tokens"),
        (_chat(max_tokens="many"), 400, "max_tokens"),
        (_chat(max_completion_tokens=2.5), 400, "max_completion_tokens"),
        (_chat(model="no-such-model"), 404, "model"),
    ],
)
async def test_bad_input_is_a_clear_error(
    policy: Policy, clock: FakeClock, body: bytes, status: int, param: str
) -> None:
    services = make_services(policy, clock)
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    with pytest.raises(ClientError) as info:
        await TokensPlugin({}, services).request_body(ctx, body)
    assert info.value.status == status and info.value.param == param
    assert param in info.value.message or "model" in info.value.message


async def test_a_pool_naming_its_models_tokenizer_counts_the_prompt_exactly(
    policy: Policy, clock: FakeClock, tmp_path: object
) -> None:
    """Where the pool's picker loaded the model's tokenizer (``routing.tokenizer``), the prompt
    is rendered with its chat template and counted exactly, up to EXACT_BYTES rendered; past
    that (and where the template refuses) the byte bound."""
    from pathlib import Path
    from types import SimpleNamespace

    from chat.tokenizer import HfChatTokenizer
    from filters.plugins.picker.prompt import prompt_bytes
    from filters.plugins.tokens.plugin import EXACT_BYTES
    from tests.chat_model import make_model_dir

    assert isinstance(tmp_path, Path)
    tok = HfChatTokenizer.load(make_model_dir(tmp_path / "model"))
    picker = SimpleNamespace(model=tok, render=lambda kind, data: prompt_bytes(kind, data, tok))
    services = replace(make_services(policy, clock), pickers=SimpleNamespace(get=lambda p: picker))
    plugin = TokensPlugin({}, services)
    text = "Tell me about weirs, rivers and the naïve café by the mill. " * 20
    body = json.dumps({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": text}]})
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    await plugin.request_body(ctx, body.encode())
    rendered = prompt_bytes("chat", json.loads(body), tok)
    assert rendered is not None and ctx.rendered == rendered  # the picker hashes these bytes
    assert ctx.prompt_tokens == len(tok.encode(rendered.decode()))
    assert ctx.prompt_tokens < len(text)  # far under the byte bound
    long = json.dumps({"model": "llama-3.1-8b", "messages": [
        {"role": "user", "content": "x" * (EXACT_BYTES + 1)}]})  # fmt: skip
    ctx = make_ctx(tenant="demo-pro", tier="pro")
    await plugin.request_body(ctx, long.encode())
    assert ctx.rendered is None and ctx.prompt_tokens is not None
    assert ctx.prompt_tokens >= EXACT_BYTES + 1  # its bytes: the bound


async def test_an_embedding_reserves_its_prompt_alone(policy: Policy, clock: FakeClock) -> None:
    budget = FakeBudget({"demo-pro": 300})
    clamping = replace(policy, reservation=ReservationPolicy(short_budget="clamp"))
    services = make_services(clamping, clock, budget=budget)
    ctx = make_ctx(path="/v1/embeddings", tenant="demo-pro", tier="pro", lane="interactive")
    body = json.dumps({"model": "llama-3.1-8b", "input": [[1, 2, 3], [4, 5]]}).encode()
    r = await TokensPlugin({}, services).request_body(ctx, body)
    assert r is not None and r.body is None  # no max_tokens written into an embeddings body
    assert (ctx.prompt_tokens, ctx.max_tokens, ctx.reserve, ctx.stream) == (5, 0, 5, False)
    assert r.set_headers is not None and r.set_headers["x-tokenweir-reserve"] == "5"
