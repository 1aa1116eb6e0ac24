"""Quotas and usage settlement on a PD pool, end to end: real Envoy (our control plane), Redis,
the rate-limit service and the filter server as processes, a prefill and a decode emulator.

A tenant's PD request reserves its tokens through the rate limit, is served by the
prefill/decode pair (the decode side answers only once the prefill's KV arrived: the room both
sides saw is checked), and settles exactly what the decode side reported (prompt + completion
tokens) to the tenant's budget, streamed or not.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from policy import load_policy
from quota.reader import QuotaReader
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BUDGET = 2000
KEY = "carol-key-123"


def _policy(gw: int, fp: int, rp: int, redis_url: str, pre: tuple[int, int], dec: int) -> str:
    pd = (f"disaggregation: {{prefill: [{{address: 127.0.0.1:{pre[0]}, bootstrap_port: {pre[1]}}}], "
          f"decode: [127.0.0.1:{dec}]}}")  # fmt: skip
    checks = "health_check: {interval: 200ms, timeout: 200ms, unhealthy_threshold: 1}"
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, filters="message_timeout: 5s",
        pools={"chat": f"{{models: [m1], {checks}, retries: {{num_retries: 0}}, {pd}}}"},
        routes=[metered_route(plugins="identity, tokens, lane, pd, usage")],
        rest=token_tier(BUDGET, {"carol": KEY}),
    )  # fmt: skip


def _emulator(tmp: Path, name: str, port: int, *extra: str) -> ChildProcess:
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m1",
            "--profile", "seed-2k", "--time-scale", "0.02", "--log-level", "WARNING",
            "--disaggregation-timeout", "5", *extra]  # fmt: skip
    return ChildProcess(argv, log=tmp / f"{name}.log")


async def test_a_pd_request_reserves_and_settles_its_tokens_to_the_tenant(
    tmp_path: Path, redis_port: int
) -> None:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    gw, fp, rp = free_port(), free_port(), free_port()
    pre, dec = (free_port(), free_port()), free_port()
    ports = {"ratelimit_service": rp, "filters": fp}
    children = [
        _emulator(tmp_path, "prefill", pre[0], "--disaggregation-mode", "prefill",
                  "--disaggregation-bootstrap-port", str(pre[1])),
        _emulator(tmp_path, "decode", dec, "--disaggregation-mode", "decode"),
    ]  # fmt: skip
    try:
        for port in (*pre, dec):
            await asyncio.to_thread(wait_for_port, port, 30.0)
        async with (
            mesh(tmp_path, _policy(gw, fp, rp, redis_url, pre, dec), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, timeout=40.0),
        ):
            reader = QuotaReader(r, load_policy(m.policy_path), timeout=5.0)

            async def spent() -> int:
                left = await reader.remaining("carol", "m1", "interactive")
                assert left is not None
                return BUDGET - left

            async def settled(before: int) -> int:
                deadline = time.monotonic() + 5.0
                now = await spent()
                while now == before and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    now = await spent()
                await asyncio.sleep(0.3)  # nothing else may arrive later
                return await spent()

            async with aiohttp.ClientSession() as http:

                async def chat(stream: bool) -> tuple[int, Any]:
                    body = {"model": "m1", "max_tokens": 30, "stream": stream,
                            "messages": [{"role": "user", "content": "tell me about weirs " * 10}]}  # fmt: skip
                    if stream:
                        body["stream_options"] = {"include_usage": True}
                    headers = {"authorization": f"Bearer {KEY}"}
                    async with http.post(
                        f"http://127.0.0.1:{gw}/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        raw = await resp.read()
                    if not stream or resp.status != 200:
                        return resp.status, json.loads(raw)
                    chunks = [json.loads(line[6:]) for line in raw.decode().splitlines()
                              if line.startswith("data: {")]  # fmt: skip
                    return resp.status, chunks[-1]

                async def room(port: int) -> list[Any]:
                    async with http.get(f"http://127.0.0.1:{port}/_emulator/state") as resp:
                        return (await resp.json())["disaggregation"]["recent_rooms"]  # type: ignore[no-any-return]

                # Envoy's health checks find the decode replica before traffic is sent
                deadline = time.monotonic() + 20
                status, answer = await chat(False)
                while status == 503 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    status, answer = await chat(False)
                assert status == 200, answer
                before = await settled(0)
                usage = answer["usage"]
                assert before == usage["prompt_tokens"] + usage["completion_tokens"] > 0
                assert [x["room"] for x in await room(pre[0])] == [
                    x["room"] for x in await room(dec)
                ]  # served by the pair

                for stream in (True, False):
                    status, answer = await chat(stream)
                    assert status == 200, answer
                    usage = answer["usage"]
                    now = await settled(before)
                    assert now - before == usage["prompt_tokens"] + usage["completion_tokens"]
                    before = now
                assert len(await room(dec)) == 3
    finally:
        for child in children:
            child.close()
        await r.aclose()
