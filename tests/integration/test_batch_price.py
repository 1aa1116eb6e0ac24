"""A batch line pays the batch price (``batch.price_factor``), end to end: real Envoy, Redis,
rate-limit service and filter server as processes; the tenant's ``usd`` budget in Redis is
charged half for a line of the runner's route what the same request costs interactive
(issue 41)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.filters.fake_openai import FakeOpenAI
from tests.helpers import free_port
from tests.integration.mesh_harness import mesh, mesh_policy, metered_route, service_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEY = "erin-key-1234"
FRAN_KEY, GUS_KEY = "fran-key-1234", "gus-key-12345"
LEAN_BUDGET = 1600  # micro-USD a day: fran's whole budget
PROMPT, COMPLETION = 0.002, 0.006  # USD per 1k tokens: 2 and 6 micro-USD per token


def policy_text(gw: int, fp: int, rp: int, redis_url: str, backend: FakeOpenAI) -> str:
    routes = [
        "{name: batch-jobs, match: {prefix: /v1/batches}, service: batch-api, filters: {plugins: "
        "[{name: identity, settings: {forward_authorization: true}}]}}",
        metered_route(
            "batch-lines", match='{prefix: /v1/, headers: {x-batch-line: "1"}}',
            plugins="identity, idempotency, lane, tokens, prefix, usage", extra=", lane: batch",
        ),
        metered_route(),
    ]  # fmt: skip
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, pools={"chat": ("m1", backend.port)},
        routes=routes, rest=f"""
services:
  batch-api: {{endpoints: ["127.0.0.1:{free_port()}"]}}
batch:
  service: batch-api
  gateway: edge
  pool: chat
  price_factor: 0.5
  runner: {{replicas: 0}}
prices:
  m1: {{prompt: {PROMPT}, completion: {COMPLETION}}}
tiers:
  paid:
    max_tokens: 100
    quotas: {{usd: {{per_day: 10}}}}
  lean:
    max_tokens: 100
    quotas: {{usd: {{per_day: {LEAN_BUDGET / 1e6}}}}}
tenants:
  erin: {{tier: paid, api_keys: [{KEY}]}}
  fran: {{tier: lean, api_keys: [{FRAN_KEY}]}}
  gus: {{tier: paid, api_keys: [{GUS_KEY}]}}
""",
    )  # fmt: skip


async def spent(r: aioredis.Redis, before: int, timeout: float = 8.0) -> int:
    """The tenant's usd spent today (micro-USD) once a settlement changed it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout

    async def now() -> int:
        keys = await r.keys("tw:{erin}:w:usd:day:*")
        return sum([int(await r.get(k) or 0) for k in keys])

    got = await now()
    while got == before and loop.time() < end:
        await asyncio.sleep(0.05)
        got = await now()
    await asyncio.sleep(0.3)  # the reservation replaced by the settlement, nothing later
    return await now()


async def test_a_batch_line_is_charged_the_batch_price(tmp_path: Path, redis_port: int) -> None:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    backend = FakeOpenAI(name="b0", words=40)
    await backend.start()
    gw, fp, rp = free_port(), free_port(), free_port()
    ports = {"ratelimit_service": rp, "filters": fp}
    body = json.dumps({"model": "m1", "max_tokens": 60,
                       "messages": [{"role": "user", "content": "tell me about weirs"}]})  # fmt: skip
    base = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    try:
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, backend), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, timeout=40.0),
            aiohttp.ClientSession() as s,
        ):
            url = f"http://127.0.0.1:{gw}/v1/chat/completions"
            async with s.post(url, data=body, headers=base) as resp:
                assert resp.status == 200, await resp.text()
                usage = (await resp.json())["usage"]
            full = await spent(r, 0)
            line = base | {"x-batch-line": "1", "idempotency-key": "batch-b1-0"}
            async with s.post(url, data=body, headers=line) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["usage"] == usage  # the same work
            both = await spent(r, full)
    finally:
        await backend.aclose()
        await r.aclose()
    p, c = usage["prompt_tokens"], usage["completion_tokens"]
    price = (p * PROMPT + c * COMPLETION) * 1000  # micro-USD
    assert full == math.ceil(price - 1e-6), (full, usage)
    assert both - full == math.ceil(price * 0.5 - 1e-6), (both, full, usage)


async def test_a_budget_admits_the_batch_lines_its_batch_price_allows(
    tmp_path: Path, redis_port: int
) -> None:
    """The reservation of a batch line is at the batch price too: lines in flight together
    (slow streams hold their reservations) are admitted while their *batch* worst cases fit
    the tenant's usd budget — twice as many as at the whole price."""
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    backend = FakeOpenAI(name="b0", words=20, gap=0.25)  # 5 s streams
    await backend.start()
    gw, fp, rp = free_port(), free_port(), free_port()
    ports = {"ratelimit_service": rp, "filters": fp}
    body = json.dumps({"model": "m1", "max_tokens": 60, "stream": True,
                       "messages": [{"role": "user", "content": "tell me about weirs"}]})  # fmt: skip
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"

    async def line(s: aiohttp.ClientSession, key: str, i: int) -> int:
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json",
                   "x-batch-line": "1", "idempotency-key": f"batch-b-{key}-{i}"}  # fmt: skip
        async with s.post(url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status

    try:
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, backend), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, timeout=40.0),
            aiohttp.ClientSession() as s,
        ):
            assert await line(s, GUS_KEY, 0) == 200  # the same line for a rich tenant: its size
            reserve = int(backend.seen[-1][0]["x-tokenweir-reserve"])
            statuses = await asyncio.gather(*(line(s, FRAN_KEY, i) for i in range(10)))
    finally:
        await backend.aclose()
        await r.aclose()
    worst = reserve * max(PROMPT, COMPLETION) * 1000  # micro-USD of the line at the whole price
    batch_fits = LEAN_BUDGET // math.ceil(worst * 0.5 - 1e-6)
    assert LEAN_BUDGET // math.ceil(worst - 1e-6) < batch_fits < 10, (reserve, batch_fits)
    assert statuses.count(200) == batch_fits, (statuses, reserve)
    assert set(statuses) == {200, 429}, statuses
