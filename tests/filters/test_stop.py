"""The in-stream stop: counting and cutting (filters/plugins/usage/stop.py) and the usage plugin that ends a
stream at the tenant's budget (top-ups from a fake store that keeps a bucket, a fake aborter)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from filters.api import Result
from filters.bodies import parse_request
from filters.plugins.usage.plugin import UsagePlugin
from filters.plugins.usage.stop import cut, generate_count, quick_count, stop_events, stream_head
from filters.services import Services
from filters.sse import event_json, split_events
from quota.errors import QuotaUnavailable
from quota.topup import NO_RECORD, TopUp
from tests.filters.conftest import FakeClock, make_ctx


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


HEAD = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 5, "model": "m"}
ROLE = ev({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})


def word(i: int) -> bytes:
    return ev({**HEAD, "choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})


FINISH = ev({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
DONE = b"data: [DONE]\n\n"


def answer(n: int) -> list[bytes]:
    """A backend stream of ``n`` tokens, the first chunk with the role event, then the
    finish, the usage event and [DONE] in the last chunk."""
    usage = ev({**HEAD, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}})
    return [ROLE + word(0), *(word(i) for i in range(1, n)), FINISH + usage + DONE]


class Bucket:
    """A fake top-up store: one bucket of ``left`` tokens."""

    def __init__(self, left: int, status: int = 1) -> None:
        self.left = left
        self.status = status
        self.asked: list[int] = []

    async def topup(self, record: str, want: int, usd_per_1k: int = 0) -> TopUp:
        self.asked.append(want)
        if self.status != 1:
            return TopUp(self.status, 0)
        g = min(want, self.left)
        self.left -= g
        return TopUp(1 if g > 0 else 0, g)


class Broken:
    async def topup(self, record: str, want: int, usd_per_1k: int = 0) -> TopUp:
        raise QuotaUnavailable("redis: down")


class Aborts:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def abort(self, host: str, rid: str) -> None:
        self.calls.append((host, rid))


def plugin(services: Services, topups: Any, block: int = 4) -> tuple[UsagePlugin, Aborts]:
    aborts = Aborts()
    svc = replace(services, topups=topups, aborts=aborts)
    return UsagePlugin({"stop_at_budget": True, "topup_tokens": block}, svc), aborts


def stream_ctx(reserve_completion: int, *, wants_usage: bool = True, path: str = "chat"):  # type: ignore[no-untyped-def]
    if path == "generate":
        body = {"text": "x", "sampling_params": {"max_new_tokens": 100}, "stream": True}
        ctx = make_ctx(path="/generate", tenant="demo-pro", model="m", request_id="r1")
        ctx.body = parse_request("generate", json.dumps(body).encode())
    else:
        opts = {"stream_options": {"include_usage": True}} if wants_usage else {}
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                **opts}  # fmt: skip
        ctx = make_ctx(tenant="demo-pro", model="m", request_id="r1")
        ctx.body = parse_request("chat", json.dumps(body).encode())
    ctx.stream, ctx.client_wants_usage = True, wants_usage
    ctx.prompt_tokens, ctx.max_tokens = 9, 100
    ctx.reserve = 9 + reserve_completion
    return ctx


async def run(p: UsagePlugin, ctx: Any, chunks: list[bytes], clock: FakeClock):  # type: ignore[no-untyped-def]
    await p.response_headers(ctx, {"x-tokenweir-upstream": "127.0.0.1:30000"})
    out, meta = [], {}
    for i, c in enumerate(chunks):
        clock.now += 0.01
        r = await p.response_chunk(ctx, c, i == len(chunks) - 1)
        out.append(c if r is None or r.body is None else r.body)
        if r is not None:
            meta.update(r.metadata)
    await p.stream_end(ctx)
    return b"".join(out), meta


def tokens_in(body: bytes) -> int:
    events, _ = split_events(body)
    n = 0
    for e in events:
        obj = event_json(e)
        if isinstance(obj, dict):
            n += sum(1 for c in obj.get("choices") or () if (c.get("delta") or {}).get("content"))
    return n


# ---- pure -----------------------------------------------------------------------------------


def test_quick_count_is_an_upper_bound_of_tokens() -> None:
    assert quick_count(b"\n" + ROLE + word(0)) == 2  # the role event counts: early, never late
    assert quick_count(b"\n" + FINISH + DONE) == 1
    assert quick_count(b"\n" + b"".join(word(i) for i in range(5))) == 5


def test_cut_keeps_whole_events_up_to_the_allowance() -> None:
    data = b"\n" + ROLE + b"".join(word(i) for i in range(5)) + FINISH
    c = cut(data, 3, generate=False, at_line_start=False)
    assert c.stopped and c.tokens == 3
    assert data[: c.keep] == b"\n" + ROLE + word(0) + word(1) + word(2)
    c = cut(data, 5, generate=False, at_line_start=False)  # role and finish carry no token
    assert not c.stopped and c.tokens == 5 and c.keep == len(data)


def test_cut_of_a_generate_stream_reads_its_cumulative_count() -> None:
    evs = [ev({"text": "a " * n, "meta_info": {"id": "g1", "completion_tokens": n}})
           for n in (2, 5, 9)]  # fmt: skip
    data = b"\n" + b"".join(evs)
    assert generate_count(data) == 9
    c = cut(data, 6, generate=True, at_line_start=False)
    assert c.stopped and c.tokens == 5 and data[: c.keep] == b"\n" + evs[0] + evs[1]
    assert c.last["meta_info"]["completion_tokens"] == 5


def test_stop_events_close_an_openai_stream() -> None:
    out = stop_events("chat", stream_head(ROLE), 9, 4, with_usage=True)
    events = [event_json(e) for e in split_events(out)[0]]
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert events[0]["id"] == "chatcmpl-7" and events[0]["model"] == "m"
    assert events[1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    assert out.endswith(DONE) and len(events) == 3
    assert b"usage" not in stop_events("completion", None, 9, 4, with_usage=False)


# ---- the plugin -----------------------------------------------------------------------------


@pytest.mark.parametrize("wants_usage", [True, False])
async def test_a_stream_is_cut_exactly_at_reservation_plus_topups(
    services: Services, clock: FakeClock, wants_usage: bool
) -> None:
    bucket = Bucket(left=13)
    p, aborts = plugin(services, bucket, block=4)
    ctx = stream_ctx(10, wants_usage=wants_usage)
    body, meta = await run(p, ctx, answer(60), clock)
    assert tokens_in(body) == 23  # 10 reserved + 13 drawn in top-ups: not one more
    assert bucket.left == 0 and bucket.asked[-1] >= 1
    events = [event_json(e) for e in split_events(body)[0]]
    closing = [e for e in events if isinstance(e, dict) and e["choices"]
               and e["choices"][0].get("finish_reason")]  # fmt: skip
    assert [c["choices"][0]["finish_reason"] for c in closing] == ["length"]
    usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
    assert usage == ([{"prompt_tokens": 9, "completion_tokens": 23, "total_tokens": 32}]
                     if wants_usage else [])  # fmt: skip
    assert body.endswith(DONE) and body.count(DONE) == 1
    assert meta["settle_tokens"] == 9 + 23
    assert aborts.calls == [("127.0.0.1:30000", "chatcmpl-7")]
    assert ctx.usage.completion_tokens == 23
    m = services.metrics
    assert (
        m.registry.get_sample_value(
            "tokenweir_filters_budget_stops_total",
            {"route": "chat-completions", "tenant": "demo-pro"},
        )
        == 1
    )


async def test_an_answer_within_the_budget_is_untouched(
    services: Services, clock: FakeClock
) -> None:
    p, aborts = plugin(services, Bucket(left=0))
    chunks = answer(8)
    body, meta = await run(p, stream_ctx(10), chunks, clock)
    assert body == b"".join(chunks) and meta["settle_tokens"] == 9 + 8 and not aborts.calls


async def test_a_stream_split_at_odd_bytes_is_cut_as_exactly(
    services: Services, clock: FakeClock
) -> None:
    """Envoy's chunks need not follow events: every 23 bytes, split inside 'data:' too."""
    stream = b"".join(answer(40))
    pieces = [stream[i : i + 23] for i in range(0, len(stream), 23)]
    for wants in (True, False):
        p, _ = plugin(services, Bucket(left=7), block=3)
        body, _ = await run(p, stream_ctx(5, wants_usage=wants), pieces, clock)
        # 5 + 7 granted; a first event split across chunks counts as a token until it is
        # whole (the role event here): the stop may come one token early, never late
        assert tokens_in(body) in (11, 12)
        events = [event_json(e) for e in split_events(body)[0]]
        assert all(e is not None for e in events[:-1])  # every event the client gets parses
        assert body.endswith(DONE)
        closing = [e for e in events if e and e["choices"] and e["choices"][0].get("finish_reason")]
        assert [(e["model"], e["choices"][0]["finish_reason"]) for e in closing] == [
            ("m", "length")
        ]


async def test_a_refused_topup_stops_and_later_chunks_are_dropped(
    services: Services, clock: FakeClock
) -> None:
    p, _ = plugin(services, Bucket(left=0))
    ctx = stream_ctx(3)
    chunks = answer(20)
    await p.response_headers(ctx, {})
    outs = []
    for c in chunks:
        r = await p.response_chunk(ctx, c, False)
        outs.append(r)
    bodies = [
        c if r is None or r.body is None else r.body for c, r in zip(chunks, outs, strict=True)
    ]
    assert tokens_in(b"".join(bodies)) == 3
    stop_at = next(
        i for i, r in enumerate(outs) if isinstance(r, Result) and r.body and DONE in r.body
    )
    assert all(r is not None and r.body == b"" for r in outs[stop_at + 1 :])


async def test_generate_stream_stops_at_its_cumulative_count(
    services: Services, clock: FakeClock
) -> None:
    p, aborts = plugin(services, Bucket(left=2), block=2)
    ctx = stream_ctx(4, path="generate")
    chunks = [ev({"text": "w " * n, "meta_info": {"id": "g1", "prompt_tokens": 2,
                                                  "completion_tokens": n}}) for n in range(1, 20)]  # fmt: skip
    body, meta = await run(p, ctx, [*chunks, DONE], clock)
    events = [event_json(e) for e in split_events(body)[0]]
    assert events[-1] is None  # [DONE]
    last = events[-2]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert len(last["text"].split()) == 6 and body.endswith(DONE)
    assert meta["settle_tokens"] == 9 + 6 and aborts.calls == [("127.0.0.1:30000", "g1")]


async def test_no_record_runs_unmetered_and_a_store_error_fails_open(
    services: Services, clock: FakeClock
) -> None:
    p, aborts = plugin(services, Bucket(left=0, status=NO_RECORD))
    chunks = answer(30)
    unlimited = stream_ctx(5)
    unlimited.tenant = "no-token-limit"  # not in the policy: no token limit, no record
    body, _ = await run(p, unlimited, chunks, clock)
    assert body == b"".join(chunks) and not aborts.calls
    # a tenant with a token limit and no record: the rate-limit service's call failed and Envoy
    # let the request through unrated; the stream ends at what it reserved
    p, aborts = plugin(services, Bucket(left=0, status=NO_RECORD))
    body, meta = await run(p, stream_ctx(5), chunks, clock)
    assert body != b"".join(chunks) and b'"finish_reason":"length"' in body
    assert meta["settle_tokens"] == 9 + 5 and body.endswith(DONE)
    assert (
        services.metrics.registry.get_sample_value(
            "tokenweir_filters_topups_total", {"tenant": "demo-pro", "result": "unreserved"}
        )
        == 1
    )
    p, aborts = plugin(services, Broken())
    body, _ = await run(p, stream_ctx(5), chunks, clock)
    assert body == b"".join(chunks) and not aborts.calls
    assert (
        services.metrics.registry.get_sample_value(
            "tokenweir_filters_topups_total", {"tenant": "demo-pro", "result": "error"}
        )
        >= 1
    )


async def test_a_non_streamed_request_reserves_all_of_max_tokens(services: Services) -> None:
    p, _ = plugin(services, Bucket(left=0))
    ctx = stream_ctx(10)
    ctx.stream = False
    r = await p.request_body(ctx, b"")
    assert r is not None and r.set_headers["x-tokenweir-reserve"] == "109" and ctx.reserve == 109
    ctx = stream_ctx(10)
    assert await p.request_body(ctx, b"") is None and ctx.reserve == 19  # streams: the stop
    off = UsagePlugin({}, services)
    ctx = stream_ctx(10)
    ctx.stream = False
    assert await off.request_body(ctx, b"") is None


def test_settings_are_checked(services: Services) -> None:
    from filters.errors import ConfigError

    with pytest.raises(ConfigError, match="stop_at_budget must be true or false"):
        UsagePlugin({"stop_at_budget": "yes"}, services)
    with pytest.raises(ConfigError, match="topup_tokens must be an integer from 1"):
        UsagePlugin({"topup_tokens": 0}, services)


async def test_a_generate_event_split_across_chunks_is_counted_before_it_passes(
    services: Services, clock: FakeClock
) -> None:
    """/generate events carry several tokens and their count inside: one split mid-number
    ("completion_tokens": 1|2) is held until whole, so the 12-token event is not let through
    on the strength of a partial "1"."""
    p, aborts = plugin(services, Bucket(left=0))
    ctx = stream_ctx(4, path="generate")
    evs = [ev({"text": "w " * n, "meta_info": {"id": "g1", "completion_tokens": n}})
           for n in (2, 4, 12)]  # fmt: skip
    stream = b"".join(evs) + DONE
    split = stream.index(b'"completion_tokens": 12') + len(b'"completion_tokens": 1')
    body, meta = await run(p, ctx, [stream[:split], stream[split:]], clock)
    events = [event_json(e) for e in split_events(body)[0]]
    texts = [e["text"] for e in events if e]
    assert all(len(t.split()) <= 4 for t in texts)
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert meta["settle_tokens"] == 9 + 4 and aborts.calls == [("127.0.0.1:30000", "g1")]


async def test_a_generate_stream_within_the_budget_passes_whole(
    services: Services, clock: FakeClock
) -> None:
    p, _ = plugin(services, Bucket(left=0))
    evs = [ev({"text": "w " * n, "meta_info": {"id": "g1", "completion_tokens": n}})
           for n in (1, 2, 3)]  # fmt: skip
    stream = b"".join(evs) + DONE
    pieces = [stream[i : i + 17] for i in range(0, len(stream), 17)]
    body, _ = await run(p, stream_ctx(10, path="generate"), pieces, clock)
    assert body == stream
