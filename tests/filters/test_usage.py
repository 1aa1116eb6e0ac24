from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.api import Result, Usage
from filters.bodies import parse_request
from filters.plugins.usage.plugin import UsagePlugin
from filters.services import Services
from filters.sse import split_events
from policy import load_policy
from tests.filters.conftest import ROOT, FakeClock, make_ctx, make_services


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CHUNKS = [
    ev({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": None}),
    ev({"choices": [{"delta": {"content": "Hello"}}]}),
    ev({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
    ev({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2,
                                 "prompt_tokens_details": {"cached_tokens": 4}}}),
    b"data: [DONE]\n\n",
]  # fmt: skip


def streaming_ctx(wants_usage: bool):  # type: ignore[no-untyped-def]
    opts = {"stream_options": {"include_usage": True}} if wants_usage else {}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, **opts}
    ctx = make_ctx(tenant="demo-pro", model="m")
    ctx.body = parse_request("chat", json.dumps(body).encode())
    ctx.stream, ctx.client_wants_usage = True, wants_usage
    return ctx


def quiet(r: Result | None) -> bool:
    """Nothing changed and nothing settled: at most the first chunk's TTFT for the access log."""
    return r is None or (r.body is None and set(r.metadata) <= {"ttft_ms"})


async def run(plugin: UsagePlugin, ctx, chunks: list[bytes], clock: FakeClock):  # type: ignore[no-untyped-def]
    out, meta = [], {}
    for i, c in enumerate(chunks):
        clock.now += 0.01
        r = await plugin.response_chunk(ctx, c, i == len(chunks) - 1)
        out.append(c if r is None or r.body is None else r.body)
        if r is not None:
            meta.update(r.metadata)
    await plugin.stream_end(ctx)
    return b"".join(out), meta


async def test_usage_chunk_dropped_when_client_did_not_ask(
    services: Services, clock: FakeClock
) -> None:
    ctx = streaming_ctx(False)
    body, meta = await run(UsagePlugin({}, services), ctx, CHUNKS, clock)
    assert meta["settle_tokens"] == 13
    assert ctx.usage == Usage(11, 2, 4)
    assert b'"usage": {' not in body and body.endswith(b"data: [DONE]\n\n")
    assert body == b"".join(c for i, c in enumerate(CHUNKS) if i != 3)


async def test_usage_chunk_kept_when_client_asked(services: Services, clock: FakeClock) -> None:
    ctx = streaming_ctx(True)
    body, meta = await run(UsagePlugin({}, services), ctx, CHUNKS, clock)
    assert body == b"".join(CHUNKS) and meta["settle_tokens"] == 13


async def test_usage_event_split_across_chunks(services: Services, clock: FakeClock) -> None:
    stream = b"".join(CHUNKS)
    pieces = [stream[i : i + 37] for i in range(0, len(stream), 37)]
    for wants in (False, True):
        ctx = streaming_ctx(wants)
        body, meta = await run(UsagePlugin({}, services), ctx, pieces, clock)
        assert meta["settle_tokens"] == 13
        expected = (
            b"".join(CHUNKS) if wants else b"".join(c for i, c in enumerate(CHUNKS) if i != 3)
        )
        assert body == expected


async def test_json_usage_and_metrics(services: Services, clock: FakeClock) -> None:
    ctx = make_ctx(tenant="demo-pro", model="m", prompt_tokens=10)
    plugin = UsagePlugin({}, services)
    body = json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    ).encode()
    assert quiet(await plugin.response_chunk(ctx, body[:20], False))
    r = await plugin.response_chunk(ctx, body[20:], True)
    assert r is not None and r.metadata["settle_tokens"] == 15
    await plugin.stream_end(ctx)
    reg = services.metrics.registry
    assert (
        reg.get_sample_value(
            "tokenweir_filters_tokens_total",
            {"tenant": "demo-pro", "model": "m", "kind": "completion"},
        )
        == 5
    )
    assert (
        reg.get_sample_value(
            "tokenweir_filters_ttft_seconds_count",
            {"tenant": "demo-pro", "model": "m", "lane": ctx.lane or "unknown"},
        )
        == 1
    )


async def test_generate_stream_settles_from_last_meta_info(
    services: Services, clock: FakeClock
) -> None:
    ctx = make_ctx(path="/generate", tenant="t", model="m")
    ctx.body = parse_request("generate", b'{"text":"hi","stream":true}')
    chunks = [
        ev({"text": "a", "meta_info": {"prompt_tokens": 3, "completion_tokens": 1}}),
        ev({"text": "a b", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2}}),
        b"data: [DONE]\n\n",
    ]
    body, meta = await run(UsagePlugin({}, services), ctx, chunks, clock)
    assert meta["settle_tokens"] == 5 and body == b"".join(chunks)


async def test_error_bodies_settle_nothing(services: Services) -> None:
    ctx = make_ctx()
    plugin = UsagePlugin({}, services)
    body = b'{"error":{"message":"overloaded","type":"server_error","code":503}}'
    assert quiet(await plugin.response_chunk(ctx, body, True))
    assert ctx.usage is None


async def test_a_stream_cut_short_settles_what_it_produced(
    services: Services, clock: FakeClock
) -> None:
    ctx = streaming_ctx(False)
    ctx.prompt_tokens, ctx.max_tokens, ctx.reserve = 11, 3, 14
    plugin = UsagePlugin({}, services)
    words = [ev({"choices": [{"delta": {"content": f"w{i}"}}]}) for i in range(5)]
    seen = []
    for chunk in (words[0], words[1] + words[2], words[3] + words[4]):
        r = await plugin.response_chunk(ctx, chunk, False)
        assert r is not None and r.body is None  # nothing held back or rewritten
        seen.append(r.metadata["settle_tokens"])
    assert seen == [12, 14, 14]  # the prompt, then a token per event, capped at max_tokens
    assert ctx.usage is None  # an estimate, never taken for the reported usage


async def test_json_without_usage_keeps_the_worst_case(services: Services) -> None:
    ctx = make_ctx()
    ctx.reserve = 300
    plugin = UsagePlugin({}, services)
    r = await plugin.response_chunk(ctx, b'{"choices":[{"text":"hi"}]}', True)
    assert r is not None and r.metadata["settle_tokens"] == 300
    other = make_ctx()
    other.reserve = 300
    assert quiet(await plugin.response_chunk(other, b"Internal Server Error", True))


def test_split_events() -> None:
    events, tail = split_events(b"data: a\n\ndata: b\r\n\r\ndata: c")
    assert events == [b"data: a\n\n", b"data: b\n\n"] and tail == b"data: c"


@settings(max_examples=150, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=len(b"".join(CHUNKS)) - 1), max_size=12),
    wants=st.booleans(),
)
async def test_any_chunking_gives_the_same_stream_and_usage(cuts: list[int], wants: bool) -> None:
    stream = b"".join(CHUNKS)
    points = sorted(set(cuts))
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    services = make_services(load_policy(ROOT / "examples" / "mesh.yaml"), FakeClock())
    ctx = streaming_ctx(wants)
    body, meta = await run(UsagePlugin({}, services), ctx, pieces, FakeClock())
    assert meta["settle_tokens"] == 13
    assert body == (stream if wants else b"".join(c for i, c in enumerate(CHUNKS) if i != 3))


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=80), min_size=1, max_size=6), sse=st.booleans())
async def test_garbage_responses_never_crash(chunks: list[bytes], sse: bool) -> None:
    services = make_services(load_policy(ROOT / "examples" / "mesh.yaml"), FakeClock())
    ctx = streaming_ctx(False) if sse else make_ctx()
    plugin = UsagePlugin({}, services)
    for i, c in enumerate(chunks):
        await plugin.response_chunk(ctx, c, i == len(chunks) - 1)
    await plugin.stream_end(ctx)


async def test_a_stream_without_event_ends_is_not_held_back(
    services: Services, clock: FakeClock
) -> None:
    ctx = streaming_ctx(False)
    plugin = UsagePlugin({}, services)
    sent = b""
    for _ in range(3):
        r = await plugin.response_chunk(ctx, b"x" * 40_000, False)
        sent += b"x" * 40_000 if r is None or r.body is None else r.body
    assert len(sent) >= 80_000  # at most one chunk's worth is waiting


async def test_usage_is_priced_for_the_settle_the_log_and_the_cost_metric(
    services: Services, clock: FakeClock
) -> None:
    """examples/mesh.yaml: llama-3.1-8b costs $0.0002 prompt, $0.0001 cached, $0.0006 completion
    per 1k tokens; demo-pro's cost center is research."""
    ctx = make_ctx(tenant="demo-pro", model="llama-3.1-8b", prompt_tokens=1000)
    plugin = UsagePlugin({}, services)
    usage = {"prompt_tokens": 1000, "completion_tokens": 500,
             "prompt_tokens_details": {"cached_tokens": 400}}  # fmt: skip
    r = await plugin.response_chunk(ctx, json.dumps({"usage": usage}).encode(), True)
    assert r is not None
    # 600 x 0.2 + 400 x 0.1 + 500 x 0.6 micro-USD
    assert r.metadata["settle_usd_micros"] == str(120 + 40 + 300)
    assert r.metadata["cost_usd"] == 0.00046
    assert (r.metadata["prompt_tokens"], r.metadata["completion_tokens"]) == (1000, 500)
    assert r.metadata["cached_tokens"] == 400 and "ttft_ms" in r.metadata
    await plugin.stream_end(ctx)
    services.metrics.configure(services.policy)  # what the app does (label folding)
    await plugin.stream_end(ctx)
    got = services.metrics.registry.get_sample_value(
        "tokenweir_filters_cost_usd_total",
        {"tenant": "demo-pro", "cost_center": "research", "model": "llama-3.1-8b"},
    )
    assert got == pytest.approx(0.00046)
