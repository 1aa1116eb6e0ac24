"""Real Envoy, real Redis, the real service process, a tiny backend: a tenant over its token
budget gets 429 with retry-after and an OpenAI-style error body; settlement refunds through
Envoy's stream-done call; service routes count requests; routes without limits never ask."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis
from aiohttp import web

from policy import load_policy
from tests.helpers import free_port
from tests.ratelimit_service.support import envoy_bootstrap, start_envoy, start_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POLICY = """
version: 1
ratelimit: {address: 127.0.0.1:1, domain: tokenweir, timeout: 200ms}
pools: {chat: {models: [m1], endpoints: [127.0.0.1:1]}}
services:
  inventory: {endpoints: [127.0.0.1:1], rate_limit: {burst: 2, refill_per_second: 0.01}}
tiers:
  small: {quotas: {tokens: {burst: 1000, refill_per_second: 10}}}
tenants:
  acme: {tier: small}
"""


async def _backend(port: int) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        usage = request.headers.get("x-test-usage")
        headers = {"x-usage-tokens": usage} if usage else {}
        return web.json_response({"ok": True}, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest.fixture(params=["h2", "grpc"])
async def mesh(
    request: pytest.FixtureRequest, tmp_path: Path, redis_port: int
) -> AsyncIterator[tuple[httpx.AsyncClient, redis.Redis, int]]:
    r = redis.Redis(port=redis_port)
    for k in r.scan_iter("tw:{acme}*"):
        r.delete(k)
    for k in r.scan_iter("tw:{svc:inventory*"):
        r.delete(k)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY)
    policy = load_policy(policy_path)
    rls_port, backend, listen, admin = free_port(), free_port(), free_port(), free_port()
    runner = await _backend(backend)
    rls = start_service(
        policy_path,
        f"redis://127.0.0.1:{redis_port}/0",
        rls_port,
        tmp_path,
        extra=["--transport", request.param],
    )
    boot = tmp_path / "envoy.json"
    boot.write_text(
        json.dumps(
            envoy_bootstrap(policy, listen=listen, admin=admin, backend=backend, rls=rls_port)
        )
    )
    envoy = None
    try:
        envoy = start_envoy(boot, admin, tmp_path)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen}", timeout=10) as client:
            yield client, r, admin
    finally:
        if envoy is not None:
            envoy.close()
        rls.close()
        await runner.cleanup()
        r.close()


def _llm(reserve: int, usage: int | None = None) -> dict[str, str]:
    h = {
        "x-tokenweir-tenant": "acme",
        "x-tokenweir-model": "m1",
        "x-tokenweir-lane": "interactive",
        "x-tokenweir-reserve": str(reserve),
    }
    if usage is not None:
        h["x-test-usage"] = str(usage)
    return h


async def _bucket(r: redis.Redis, want_below: float, want_above: float) -> float:
    deadline = time.monotonic() + 5
    tk = -1.0
    while time.monotonic() < deadline:
        raw = r.hget("tw:{acme}:b:tokens", "tk")
        tk = float(raw) if raw is not None else -1.0
        if want_above <= tk <= want_below:
            return tk
        await asyncio.sleep(0.05)
    raise AssertionError(f"bucket at {tk}, expected {want_above}..{want_below}")


async def test_over_budget_gets_429_with_openai_error(
    mesh: tuple[httpx.AsyncClient, redis.Redis, int],
) -> None:
    client, r, _ = mesh
    resp = await client.post("/v1/chat/completions", headers=_llm(600, usage=100), json={})
    assert resp.status_code == 200
    assert resp.headers["x-ratelimit-limit"].startswith("1000")
    # the stream-done call settles: 600 reserved, 100 used → 500 refunded
    await _bucket(r, want_below=1000, want_above=899)
    resp = await client.post("/v1/chat/completions", headers=_llm(880, usage=880), json={})
    assert resp.status_code == 200  # only fits because of the refund
    await _bucket(r, want_below=100, want_above=0)
    resp = await client.post("/v1/chat/completions", headers=_llm(500), json={})
    assert resp.status_code == 429
    err = resp.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["quota"] == "tokens.bucket"
    assert "acme" in err["message"]
    assert resp.headers.get_list("content-type") == ["application/json"]
    assert 30 <= int(resp.headers["retry-after"]) <= 50  # ~400 tokens missing at 10/s
    assert resp.headers["x-ratelimit-quota"] == "tokens.bucket"
    assert "x-ratelimit-remaining" in resp.headers and "x-ratelimit-reset" in resp.headers


async def test_live_redis_edit_takes_effect_within_a_second(
    mesh: tuple[httpx.AsyncClient, redis.Redis, int],
) -> None:
    client, r, _ = mesh
    assert (await client.post("/v1/x", headers=_llm(900), json={})).status_code == 200
    assert (await client.post("/v1/x", headers=_llm(900), json={})).status_code == 429
    r.hset("tw:{acme}:quota", "tokens.burst", "100000")
    r.hset("tw:{acme}:b:tokens", "tk", "50000")
    await asyncio.sleep(1.0)
    assert (await client.post("/v1/x", headers=_llm(900), json={})).status_code == 200


async def test_service_route_counts_requests_and_free_route_never_asks(
    mesh: tuple[httpx.AsyncClient, redis.Redis, int],
) -> None:
    client, _, admin = mesh
    codes = [(await client.get("/inventory/items")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    before = await _rls_calls(admin)
    assert before >= 3
    codes = [(await client.get("/other", headers=_llm(10**6))).status_code for _ in range(5)]
    assert codes == [200] * 5
    assert await _rls_calls(admin) == before


async def _rls_calls(admin: int) -> int:
    async with httpx.AsyncClient() as c:
        stats = (
            await c.get(
                f"http://127.0.0.1:{admin}/stats?filter=tokenweir_ratelimit.upstream_rq_total"
            )
        ).text
    return int(stats.strip().rsplit(":", 1)[1])
