"""Idempotency keys end to end (real Envoy, Redis, rate-limit service, filter server, SGLang
emulator): a retry with the same key reaches no backend (the emulator's request counter) and
costs nothing (the tenant's quota in Redis); the replay is byte-identical (JSON and SSE); the
same key with another body is 422; while the first runs the retry is 409; another tenant's
identical key runs on its own (no leak); the answer lives in Redis, so a second filter server
(another gateway replica) replays it too."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from filters.api import Context
from filters.plugins.idempotency import IdempotencyPlugin
from filters.registry import route_info
from policy import load_policy
from tests.filters.conftest import FakeClock, make_services
from tests.integration.safety_stack import SafetyStack, safety_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def chat(text: str, *, stream: bool, max_tokens: int = 20) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": text}],
                       "max_tokens": max_tokens, "stream": stream}).encode()  # fmt: skip


async def post(st: SafetyStack, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    tenant = headers.pop("tenant", "acme")
    async with st.session.post(
        st.url + "/v1/chat/completions", data=body, headers=st.headers(tenant, **headers)
    ) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


async def test_a_retry_runs_once_is_charged_once_and_replays_byte_for_byte(
    tmp_path: Path, redis_port: int
) -> None:
    async with safety_stack(tmp_path, redis_port) as st:
        for stream in (False, True):
            key = f"order-{stream}"
            body = chat(f"weirs and dams {stream}", stream=stream)
            before_runs, before_spent = await st.backend_requests(), await st.spent("acme")
            status, h1, first = await post(st, body, **{"idempotency-key": key})
            assert status == 200 and "idempotent-replayed" not in h1
            runs = await st.backend_requests()
            assert runs == before_runs + 1
            spent = await st.settled("acme", before_spent)
            assert spent > before_spent
            status, h2, again = await post(st, body, **{"idempotency-key": key})
            assert status == 200 and h2.get("idempotent-replayed") == "true"
            assert again == first  # byte-identical (the SSE stream as recorded)
            if stream:
                assert h2.get("content-type", "").startswith("text/event-stream"), (h1, h2)
                assert b'"usage"' not in again  # the client did not ask for usage
            await asyncio.sleep(0.5)
            assert await st.backend_requests() == runs, "the retry reached the backend"
            assert await st.spent("acme") == spent, "the retry was charged"
        assert st.metric("tokenweir_filters_idempotency_total", route="llm", outcome="replay") == 2
        saved = st.metric("tokenweir_filters_backend_tokens_saved_total", route="llm",
                          how="idempotency")  # fmt: skip
        assert saved > 0


async def test_misuse_in_flight_and_other_tenants(tmp_path: Path, redis_port: int) -> None:
    async with safety_stack(tmp_path, redis_port, slow=40) as st:
        body = chat("a long answer", stream=True, max_tokens=60)
        async with st.session.post(
            st.url + "/v1/chat/completions", data=body,
            headers=st.headers(**{"idempotency-key": "k1"}),
        ) as first:  # fmt: skip
            assert first.status == 200
            await first.content.readline()  # it is streaming now
            status, headers, text = await post(st, body, **{"idempotency-key": "k1"})
            assert status == 409 and b"idempotency_key_in_use" in text
            assert headers["retry-after"] == "1"
            other = chat("another", stream=True)
            status, _, text = await post(st, other, **{"idempotency-key": "k1"})
            assert status == 422 and b"idempotency_key_reused" in text
            await first.read()
        runs = await st.backend_requests()
        # globex uses the very same key and body: its own request, acme's answer stays acme's
        status, headers, _ = await post(st, body, tenant="globex", **{"idempotency-key": "k1"})
        assert status == 200 and "idempotent-replayed" not in headers
        assert await st.backend_requests() == runs + 1
        assert await st.spent("globex") > 0


async def test_a_second_gateway_replica_replays_from_redis(tmp_path: Path, redis_port: int) -> None:
    async with safety_stack(tmp_path, redis_port) as st:
        body = chat("shared across replicas", stream=False)
        status, _, first = await post(st, body, **{"idempotency-key": "rep-1"})
        assert status == 200
        # another replica's plugin: its own process state, the same Redis
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{redis_port}/0")
        try:
            policy = load_policy(st.mesh.policy_path)
            services = replace(make_services(policy, FakeClock()), redis=redis)
            plugin = IdempotencyPlugin({}, services)
            # the first replica stores the answer as its stream ends, which may be a moment
            # after the client has it: until then the key is "still running" (retry after 1 s),
            # as a client retrying at once would be told
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10.0
            while True:
                ctx = Context(route=route_info(policy, policy.gateways["edge"].routes[0]),
                              started=0.0, method="POST", path="/v1/chat/completions",
                              tenant="acme")  # fmt: skip
                await plugin.request_headers(ctx, {"idempotency-key": "rep-1"}, False)
                result = await plugin.request_body(ctx, body)
                assert result is not None and result.reply is not None
                if b"idempotency_key_in_use" not in result.reply.body or loop.time() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert result.reply.body == first
        finally:
            await redis.aclose()
