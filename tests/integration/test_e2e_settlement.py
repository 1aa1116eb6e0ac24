"""Settlement is truthful, end to end (real Envoy, Redis, rate-limit service and filter server as
processes): an upstream error before any output settles 0, a stream the client abandons settles
what was produced, and Envoy logs nothing per request for it (it logged "Invalid hits_addend"
and kept the whole reservation, ~4k tokens each, charged)."""

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
from policy.phases import meters_usage
from quota.reader import QuotaReader
from tests.filters.fake_openai import FakeOpenAI
from tests.helpers import free_port
from tests.integration.mesh_harness import Mesh, mesh, service_processes
from tests.integration.test_e2e_budget import BUDGET, policy_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEY = "carol-key-123"


@dataclass
class Stack:
    url: str
    mesh: Mesh
    backend: FakeOpenAI
    reader: QuotaReader

    async def spent(self) -> int:
        left = await self.reader.remaining("carol", "m1", "interactive")
        assert left is not None
        return BUDGET - left

    async def settled_spent(self, before: int, timeout: float = 5.0) -> int:
        """What is spent once the settlement arrived (it is fire-and-forget after the stream)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        spent = await self.spent()
        while spent == before and loop.time() < end:
            await asyncio.sleep(0.05)
            spent = await self.spent()
        await asyncio.sleep(0.3)  # nothing else may arrive later
        return await self.spent()

    def envoy_log(self) -> str:
        return self.mesh.envoys["edge"].log_path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, redis_port: int) -> AsyncIterator[Stack]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    backend = FakeOpenAI(name="b0", words=40, gap=0.05)
    await backend.start()
    gw, fp, rp = free_port(), free_port(), free_port()
    ports = {"ratelimit_service": rp, "filters": fp}
    try:
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, backend), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, timeout=40.0),  # busy box
        ):
            yield Stack(
                f"http://127.0.0.1:{gw}",
                m,
                backend,
                QuotaReader(r, load_policy(m.policy_path), timeout=5.0),
            )
    finally:
        await backend.aclose()
        await r.aclose()


def chat(stream: bool) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": "tell me about weirs"}],
                       "max_tokens": 100, "stream": stream}).encode()  # fmt: skip


HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


async def test_an_upstream_error_settles_nothing_and_envoy_logs_nothing(
    tmp_path: Path, redis_port: int
) -> None:
    async with stack(tmp_path, redis_port) as st, aiohttp.ClientSession() as s:
        st.backend.fail_status = 500
        for stream in (False, True, False):
            before = await st.spent()
            async with s.post(
                st.url + "/v1/chat/completions", data=chat(stream), headers=HEADERS
            ) as r:
                assert r.status == 500
                await r.read()
            assert await st.settled_spent(before) == 0, "a failed request kept its reservation"
        assert "hits_addend" not in st.envoy_log()


async def test_an_abandoned_stream_settles_what_was_produced(
    tmp_path: Path, redis_port: int
) -> None:
    async with stack(tmp_path, redis_port) as st, aiohttp.ClientSession() as s:
        # a whole stream first: what one costs (prompt + 40 tokens, the backend's report)
        async with s.post(st.url + "/v1/chat/completions", data=chat(True), headers=HEADERS) as r:
            assert r.status == 200
            await r.read()
        whole = await st.settled_spent(0)
        assert 40 < whole < 100
        # then one the client leaves after a few events (of 40 tokens, 50 ms apart)
        async with s.post(st.url + "/v1/chat/completions", data=chat(True), headers=HEADERS) as r:
            assert r.status == 200
            for _ in range(6):
                await r.content.readline()
            r.close()  # the connection goes: Envoy resets the stream
        cut = await st.settled_spent(whole) - whole
        # no usage reported: the prompt is charged at the bound it was reserved at (its UTF-8
        # bytes + 4 a message + 64 a chat request: no client can lower it by leaving early,
        # docs/quotas.md), plus the events produced; a few past what the client read were in
        # flight; far from the reservation (the bound + max_tokens 100)
        bound = len("tell me about weirs") + 4 + 64
        assert bound < cut < bound + 25, (whole, cut)
        assert "hits_addend" not in st.envoy_log()
        # measured by Envoy's Lua usage meter: no response chunk went to the filter server
        routes = load_policy(st.mesh.policy_path).gateways["edge"].routes
        assert all(meters_usage(r) for r in routes if r.pool is not None)
