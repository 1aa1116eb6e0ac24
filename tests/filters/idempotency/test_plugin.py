"""The idempotency plugin on the in-memory store: claim, replay, 409, 422, tenant scope, TTL,
size bound, release on failure, store errors (no network)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from filters.api import Context, Usage
from filters.errors import ClientError, ConfigError
from filters.plugins.idempotency.errors import StoreUnavailable
from filters.plugins.idempotency.plugin import REPLAYED_HEADER, IdempotencyPlugin
from filters.plugins.idempotency.record import Entry, decode_entry, encode_entry, parse_key
from policy import Policy
from tests.filters.conftest import FakeClock, make_ctx, make_services

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
SSE = (
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


def plugin_for(policy: Policy, clock: FakeClock, **idem: Any) -> IdempotencyPlugin:
    p = dataclasses.replace(policy, idempotency=dataclasses.replace(policy.idempotency, **idem))
    return IdempotencyPlugin({}, make_services(p, clock))


def runs(result: Any) -> bool:
    """The request goes on to the backend (with the rid the plugin put in its body)."""
    return result is None or (result.reply is None and b'"rid":"idem-' in result.body)


async def run(
    plugin: IdempotencyPlugin,
    *,
    key: str | None = "k-1",
    tenant: str = "acme",
    body: bytes = BODY,
    answer: bytes | None = b'{"ok":1}',
    status: int = 200,
    ctype: str = "application/json",
    finish: bool = True,
) -> tuple[Context, Any]:
    """One request through the plugin's hooks; returns its context and the body phase result."""
    ctx = make_ctx(tenant=tenant, request_id="r")
    headers = {":method": "POST"} | ({"idempotency-key": key} if key is not None else {})
    await plugin.request_headers(ctx, headers, False)
    result = await plugin.request_body(ctx, body)
    if runs(result) and answer is not None:
        await plugin.response_headers(ctx, {":status": str(status), "content-type": ctype})
        await plugin.response_chunk(ctx, answer[:3], False)
        await plugin.response_chunk(ctx, answer[3:], finish)
        ctx.usage = Usage(5, 7)
    if finish:
        await plugin.stream_end(ctx)
    return ctx, result


async def test_a_retry_gets_the_stored_answer_and_reaches_nothing(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = plugin_for(policy, clock)
    _, first = await run(plugin)
    assert runs(first)  # the first one runs
    _, second = await run(plugin, answer=None)
    reply = second.reply
    assert reply is not None and reply.status == 200 and reply.body == b'{"ok":1}'
    assert reply.headers[REPLAYED_HEADER] == "true"
    m = plugin.services.metrics
    assert m.tokens_saved.labels("chat-completions", "idempotency")._value.get() == 12
    assert m.idempotency.labels("chat-completions", "replay")._value.get() == 1


async def test_in_flight_is_409_and_another_body_is_422(policy: Policy, clock: FakeClock) -> None:
    plugin = plugin_for(policy, clock)
    await run(plugin, finish=False)  # still running
    _, again = await run(plugin, answer=None)
    assert again.reply.status == 409 and b"idempotency_key_in_use" in again.reply.body
    assert again.reply.headers["retry-after"] == "1"
    _, other = await run(plugin, body=BODY.replace(b"hi", b"ho"), answer=None)
    assert other.reply.status == 422 and b"idempotency_key_reused" in other.reply.body


async def test_keys_are_scoped_per_tenant(policy: Policy, clock: FakeClock) -> None:
    plugin = plugin_for(policy, clock)
    await run(plugin, tenant="acme", answer=b'{"secret":"acme"}')
    _, other = await run(plugin, tenant="globex", answer=b'{"mine":1}')
    assert runs(other)  # globex's request runs: acme's answer is not visible to it
    _, again = await run(plugin, tenant="acme", answer=None)
    assert again.reply.body == b'{"secret":"acme"}'


async def test_failed_or_cut_answers_free_the_key(policy: Policy, clock: FakeClock) -> None:
    plugin = plugin_for(policy, clock)
    await run(plugin, status=500)
    _, second = await run(plugin, answer=b'{"x":1}', status=200, finish=False)
    assert runs(second)  # the 500 freed the key: the retry runs
    ctx = make_ctx(tenant="acme")  # the client went away mid-stream: stream_end without eos
    plugin2 = plugin_for(policy, clock)
    await run(plugin2, answer=b"data: partial", finish=False)
    await plugin2.stream_end(ctx)
    _, third = await run(plugin2, answer=None, finish=False)
    assert third.reply.status == 409  # that request's own claim was still live


async def test_the_answer_expires_after_ttl_and_a_claim_after_inflight_ttl(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = plugin_for(policy, clock, ttl=60.0, inflight_ttl=30.0)
    await run(plugin)
    clock.now += 61
    _, after = await run(plugin, finish=False)
    assert runs(after)  # expired: runs again (and now holds a claim)
    clock.now += 31
    _, later = await run(plugin, answer=None, finish=False)
    assert runs(later)  # the abandoned claim expired


async def test_an_answer_over_the_bound_is_not_stored_and_never_rerun(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = plugin_for(policy, clock, max_response_bytes=1024)
    await run(plugin, answer=b"x" * 2000)
    _, again = await run(plugin, answer=None)
    assert again.reply.status == 409 and b"idempotency_answer_not_stored" in again.reply.body


async def test_sse_replay_drops_the_forced_usage_event_unless_asked(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = plugin_for(policy, clock)
    await run(plugin, answer=SSE, ctype="text/event-stream")
    _, again = await run(plugin, answer=None)
    assert b'"usage"' not in again.reply.body and again.reply.body.endswith(b"[DONE]\n\n")
    asks = json.dumps({"model": "m", "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    await run(plugin, key="k-2", body=asks, answer=SSE, ctype="text/event-stream")
    _, replay = await run(plugin, key="k-2", body=asks, answer=None)
    assert replay.reply.body == SSE
    assert replay.reply.headers["content-type"] == "text/event-stream"


@pytest.mark.parametrize("raw", ["", '""', "a" * 256, "has space", "tab\tkey", "é-key"])
async def test_bad_keys_are_400(policy: Policy, clock: FakeClock, raw: str) -> None:
    with pytest.raises(ClientError) as info:
        await run(plugin_for(policy, clock), key=raw)
    assert info.value.status == 400 and info.value.code == "idempotency_key_invalid"


async def test_required_key_and_no_key(policy: Policy, clock: FakeClock) -> None:
    _, result = await run(plugin_for(policy, clock), key=None)
    assert result is None
    with pytest.raises(ClientError) as info:
        await run(plugin_for(policy, clock, require=True), key=None)
    assert info.value.code == "idempotency_key_missing"
    with pytest.raises(ConfigError):
        IdempotencyPlugin({"ttl": 5}, make_services(policy, clock))


class BrokenStore:
    async def claim(self, key: str, claim: bytes, ttl: float, lease: float) -> None:
        raise StoreUnavailable("down")


async def test_store_errors_run_or_reject_as_the_policy_says(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = plugin_for(policy, clock)
    plugin.store = BrokenStore()  # type: ignore[assignment]
    _, result = await run(plugin, answer=None, finish=False)
    assert result is None  # served without the guarantee (and without a backend rid)
    strict = plugin_for(policy, clock, on_store_error="reject")
    strict.store = BrokenStore()  # type: ignore[assignment]
    _, refused = await run(strict, answer=None, finish=False)
    assert refused.reply.status == 503 and refused.reply.headers["retry-after"] == "1"


def test_entries_round_trip_and_keys_parse() -> None:
    e = Entry("done", "fp", "o", 200, "text/event-stream", 9, b"a\nb\n\x00")
    assert decode_entry(encode_entry(e)) == e
    assert decode_entry(b"garbage") is None and decode_entry(b'{"s":"x"}\n') is None
    assert parse_key('"abc-123"', 10) == "abc-123" and parse_key("abc", 2) is None


class FakeAborts:
    """The aborter's awaited call: records each rid, answers ``ok``."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.rids: list[str] = []

    async def abort_everywhere(self, hosts: tuple[str, ...], rid: str, timeout: float) -> bool:
        assert hosts  # every replica of the route's pool
        self.rids.append(rid)
        return self.ok


def with_aborts(plugin: IdempotencyPlugin, aborts: FakeAborts) -> IdempotencyPlugin:
    plugin.services = dataclasses.replace(plugin.services, aborts=aborts)  # type: ignore[arg-type]
    return plugin


def rid_of(result: Any) -> str:
    return str(json.loads(result.body)["rid"])


def count(plugin: IdempotencyPlugin, outcome: str) -> float:
    return plugin.services.metrics.idempotency.labels("chat-completions", outcome)._value.get()


async def test_each_run_names_its_backend_request_and_a_client_gone_aborts_it_first(
    policy: Policy, clock: FakeClock
) -> None:
    aborts = FakeAborts()
    plugin = with_aborts(plugin_for(policy, clock), aborts)
    ctx, first = await run(plugin, answer=None, finish=False)
    rid = rid_of(first)
    assert rid.startswith("idem-") and json.loads(first.body)["model"] == "m"
    await plugin.stream_end(ctx)  # the client went before any answer
    assert aborts.rids == [rid] and count(plugin, "orphan_aborted") == 1
    _, second = await run(plugin, answer=None, finish=False)
    assert runs(second) and rid_of(second) != rid  # freed only once aborted; a new rid
    # an abort not confirmed keeps the claim (its lease lapses; the next holder aborts again)
    aborts.ok = False
    ctx3, _ = await run(plugin, key="k-3", answer=None, finish=False)
    await plugin.stream_end(ctx3)
    assert count(plugin, "abort_failed") == 1
    _, again = await run(plugin, key="k-3", answer=None, finish=False)
    assert again.reply.status == 409


async def test_a_dead_holders_claim_is_taken_over_after_its_lease_once_aborted(
    policy: Policy, clock: FakeClock
) -> None:
    aborts = FakeAborts(ok=False)
    plugin = with_aborts(plugin_for(policy, clock, lease=3.0, inflight_ttl=600.0), aborts)
    # its filter server then dies (the heartbeat beats every lease / 3 of real time, after
    # this test's fake clock has moved on)
    _, first = await run(plugin, answer=None, finish=False)
    _, live = await run(plugin, answer=None, finish=False)
    assert live.reply.status == 409 and aborts.rids == []  # the lease runs: the holder lives
    clock.now += 3.5
    _, waits = await run(plugin, answer=None, finish=False)
    assert waits.reply.status == 409 and aborts.rids == [rid_of(first)]  # abort unconfirmed
    assert count(plugin, "orphan_unaborted") == 1
    aborts.ok = True
    _, took = await run(plugin, answer=None, finish=False)
    assert runs(took) and aborts.rids[-1] == rid_of(first)
    assert count(plugin, "takeover") == 1 and count(plugin, "rerun_answered") == 0


async def test_a_takeover_after_the_backend_answered_is_counted_as_a_second_run(
    policy: Policy, clock: FakeClock
) -> None:
    plugin = with_aborts(plugin_for(policy, clock, lease=3.0), FakeAborts())
    ctx = make_ctx(tenant="acme", request_id="r")
    await plugin.request_headers(ctx, {":method": "POST", "idempotency-key": "k-1"}, False)
    await plugin.request_body(ctx, BODY)
    await plugin.response_headers(ctx, {":status": "200", "content-type": "application/json"})
    await asyncio.sleep(0.01)  # the answered mark is written off the answer's path
    clock.now += 3.5  # its holder died with the answer on its way back
    _, took = await run(plugin, answer=None, finish=False)
    assert runs(took) and count(plugin, "rerun_answered") == 1


def test_the_rid_is_spliced_in_or_replaced() -> None:
    from filters.plugins.idempotency.plugin import _with_rid

    assert _with_rid(make_ctx(), b' {"a": 1}', "r1") == (b'{"rid":"r1","a": 1}', "r1")
    assert _with_rid(make_ctx(), b"{}", "r1") == (b'{"rid":"r1"}', "r1")
    ctx = make_ctx()
    got = _with_rid(ctx, b'{"rid": "theirs", "a": 1}', "r1")
    assert got is not None and json.loads(got[0]) == {"rid": "r1", "a": 1}
    # the one decode, kept for the plugins after this one (filters.bodies)
    assert ctx.decoded is not None and ctx.decoded.raw == got[0]
    assert _with_rid(make_ctx(), b"[1]", "r1") is None


async def test_a_stream_cut_mid_way_is_aborted_before_its_key_is_freed(
    policy: Policy, clock: FakeClock
) -> None:
    aborts = FakeAborts()
    plugin = with_aborts(plugin_for(policy, clock), aborts)
    ctx, first = await run(plugin, answer=None, finish=False)
    ctx.stream = True
    await plugin.response_headers(ctx, {":status": "200", "content-type": "text/event-stream"})
    await plugin.response_chunk(ctx, b"data: {}\n\n", False)
    await plugin.stream_end(ctx)  # the client went mid-stream: the backend may still decode
    assert aborts.rids == [rid_of(first)] and count(plugin, "answer_lost") == 0
    assert count(plugin, "orphan_aborted") == 1
