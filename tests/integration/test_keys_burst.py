"""API keys issued through Redis under a burst (issue 9, item 1): real Envoy, the filter server
and the rate-limit service as processes, real redis-server, the SGLang emulator.

300 parallel requests, each with its own key issued live (``tokenweir keys set``), plus one
revoked key that the policy file still lists: not one valid key may get 401, and the revoked
key may never get in, although the burst is far larger than any Redis connection pool."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from filters.keys import key_name
from filters.keys_admin import main as keys_main
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REVOKED = "policy-key-revoked-0001"
VALID = 300


def policy_text(gw: int, fp: int, rp: int, redis_url: str, emulator: int) -> str:
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, ratelimit="", ratelimit_timeout="2s",
        filters="message_timeout: 10s", pools={"chat": ("m1", emulator)},
        routes=[metered_route(plugins="identity, tokens, lane, usage")],
        rest=token_tier(100000000, {"acme": REVOKED}, tier="big", max_tokens=2, refill=1000000),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def burst_stack(tmp_path: Path, redis_port: int) -> AsyncIterator[str]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    await r.aclose()
    gw, fp, rp, ep = free_port(), free_port(), free_port(), free_port()
    children = [
        ChildProcess(
            [sys.executable, "-m", "backends.emulator", "--port", str(ep), "--model", "m1",
             "--time-scale", "0.001", "--log-level", "WARNING",
             "--max-running-requests", "512", "--max-queued-requests", "1024"],
            log=tmp_path / "emulator.log",
        )
    ]  # fmt: skip
    try:
        await asyncio.to_thread(wait_for_port, ep, 30.0)
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, ep), {"edge": gw}) as m,
            service_processes(
                tmp_path, m.policy_path, None, {"ratelimit_service": rp, "filters": fp}
            ),
        ):
            yield f"http://127.0.0.1:{gw}/v1/chat/completions"
    finally:
        for c in children:
            c.close()


async def _keys(argv: list[str]) -> None:
    assert await asyncio.to_thread(keys_main, argv) == 0


async def test_300_parallel_redis_issued_keys_no_wrong_401_no_revoked_admitted(
    tmp_path: Path, redis_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    async with burst_stack(tmp_path, redis_port) as gateway:
        keys = [f"burst-key-{i:04d}-abcdef" for i in range(VALID)]
        r = aioredis.Redis.from_url(url)
        try:
            async with r.pipeline(transaction=False) as pipe:  # what `keys set` writes, in bulk
                for k in keys:
                    pipe.hset(key_name(k), mapping={"tenant": "acme"})
                await pipe.execute()
        finally:
            await r.aclose()
        await _keys(["--redis-url", url, "set", keys[0], "acme"])  # the CLI path once
        await _keys(["--redis-url", url, "revoke", REVOKED])
        capsys.readouterr()
        body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:

            async def call(key: str) -> int:
                hdrs = {"authorization": f"Bearer {key}", "content-type": "application/json"}
                async with s.post(gateway, data=body, headers=hdrs) as resp:
                    answer = await resp.read()
                    if resp.status != 200 and key != REVOKED:
                        odd.append(f"{resp.status} {answer[:300]!r}")
                    return resp.status

            odd: list[str] = []

            # the revoked key is mixed into the burst: one request in ten
            order = [k for i, k in enumerate(keys) for k in ([k, REVOKED] if i % 10 == 0 else [k])]
            statuses = await asyncio.gather(*(call(k) for k in order))
        valid = [st for k, st in zip(order, statuses, strict=True) if k != REVOKED]
        revoked = [st for k, st in zip(order, statuses, strict=True) if k == REVOKED]
        assert valid.count(401) == 0, f"{valid.count(401)} valid keys refused: {odd[:3]}"
        assert revoked and revoked.count(401) == len(revoked), f"revoked key let in: {revoked}"
        assert valid.count(200) == len(valid), odd[:5]
