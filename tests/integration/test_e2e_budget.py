"""End to end: real Envoy (our control plane), real Redis, the rate-limit service and the filter
server as processes, a fake OpenAI backend. A tenant's token budget holds across streamed and
non-streamed requests and a burst of 100 parallel ones; settlement refunds what was not used."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from policy import load_policy
from quota.reader import QuotaReader
from tests.filters.fake_openai import FakeOpenAI
from tests.helpers import free_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BUDGET = 1000


def policy_text(gw: int, fp: int, rp: int, redis_url: str, backend: FakeOpenAI) -> str:
    tenants = {"carol": "carol-key-123", "dave": "dave-key-1234"}
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, pools={"chat": ("m1", backend.port)},
        routes=[metered_route()], rest=token_tier(BUDGET, tenants),
    )  # fmt: skip


@dataclass
class E2E:
    url: str
    backend: FakeOpenAI
    reader: QuotaReader
    session: aiohttp.ClientSession

    async def chat(self, key: str, *, stream: bool = False, max_tokens: int = 100):  # type: ignore[no-untyped-def]
        body = {"model": "m1", "messages": [{"role": "user", "content": "tell me about weirs"}],
                "max_tokens": max_tokens, "stream": stream}  # fmt: skip
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        async with self.session.post(
            self.url + "/v1/chat/completions", data=json.dumps(body), headers=headers
        ) as r:
            return r.status, r.headers.copy(), await r.read()

    async def remaining(self, tenant: str) -> int:
        left = await self.reader.remaining(tenant, "m1", "interactive")
        assert left is not None
        return left

    async def wait_remaining(self, tenant: str, at_least: int, timeout: float = 5.0) -> int:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        left = await self.remaining(tenant)
        while left < at_least and loop.time() < end:
            await asyncio.sleep(0.05)
            left = await self.remaining(tenant)
        return left


@pytest.fixture(params=["grpc", "h2"])
def transport(request: pytest.FixtureRequest) -> str:
    """The filter server's transport (``--transport``): every test runs on both."""
    return str(request.param)


@contextlib.asynccontextmanager
async def e2e(tmp_path: Path, redis_port: int, transport: str) -> AsyncIterator[E2E]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    backend = FakeOpenAI(name="b0", gap=0.002)
    await backend.start()
    gw, fp, rp = free_port(), free_port(), free_port()
    ports, extra = {"ratelimit_service": rp, "filters": fp}, {"filters": ["--transport", transport]}
    try:
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, backend), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, extra=extra),
        ):
            reader = QuotaReader(r, load_policy(m.policy_path), timeout=5.0)
            async with aiohttp.ClientSession() as s:
                yield E2E(f"http://127.0.0.1:{gw}", backend, reader, s)
    finally:
        await backend.aclose()
        await r.aclose()


async def test_budget_reserve_settle_and_parallel_burst(
    tmp_path: Path, redis_port: int, transport: str
) -> None:
    async with e2e(tmp_path, redis_port, transport) as t:
        # one request: reserved prompt + 100, settled to the real 5 completion tokens + prompt
        status, _, body = await t.chat("carol-key-123")
        assert status == 200, body
        real = json.loads(body)["usage"]["total_tokens"]
        left = await t.wait_remaining("carol", BUDGET - real - 2)
        assert BUDGET - real - 2 <= left <= BUDGET - real + 1, "settlement did not refund"
        # a streamed request settles from the usage chunk the client never sees
        status, _, body = await t.chat("carol-key-123", stream=True)
        assert status == 200 and b'"usage"' not in body
        left = await t.wait_remaining("carol", BUDGET - 2 * real - 4)
        assert left >= BUDGET - 2 * real - 4, "streamed request was not settled"

        # 100 parallel requests: at every moment, the reservations of requests in flight plus
        # the real usage of finished ones stay within the budget (refunds let later ones in)
        t.backend.spans.clear()
        t.backend.gap = 0.01
        results = await asyncio.gather(
            *(t.chat("dave-key-1234", stream=i % 2 == 0) for i in range(100))
        )
        statuses = [s for s, _, _ in results]
        spans = [sp for sp in t.backend.spans if sp[2]["x-tokenweir-tenant"] == "dave"]
        assert statuses.count(200) == len(spans) >= 5
        assert statuses.count(429) == 100 - len(spans)
        for start, _, _, _ in spans:
            held = sum(int(h["x-tokenweir-reserve"]) for s0, e0, h, _ in spans if s0 <= start < e0)
            spent = sum(total for _, e0, _, total in spans if e0 <= start)
            assert held + spent <= BUDGET, f"{held} reserved + {spent} spent > budget {BUDGET}"
        admitted_tokens = sum(total for *_, total in spans)
        assert admitted_tokens <= BUDGET
        _, h429, b429 = next(r for r in results if r[0] == 429)
        assert "retry-after" in h429 and json.loads(b429)["error"]["message"]
        # after settlement the unused reservations come back and the next request gets in
        used = admitted_tokens  # a generous bound on each one's real usage
        left = await t.wait_remaining("dave", BUDGET - used)
        assert left >= BUDGET - used
        status, _, _ = await t.chat("dave-key-1234")
        assert status == 200
