"""End to end against the SGLang emulator: the official openai client (streaming and not), the
native /generate API, the clamp, usage settlement and prefix affinity, through real Envoy, the
rate-limit service, Redis and the filter server."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis

from filters.app import FilterApp, Settings
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

KEY = "erin-key-1234"


def policy_text(gw: int, fp: int, rp: int, redis_url: str, replicas: list[int]) -> str:
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, ratelimit="", pools={"chat": ("m1", replicas)},
        pool_extra=", affinity: {prefix_tokens: 64}",
        routes=[metered_route(), metered_route("native", match="{path: /generate}")],
        rest=token_tier(100000, {"erin": KEY}, tier="mid", max_tokens=12),
    )  # fmt: skip


@pytest.fixture(params=["grpc", "h2"])
def transport(request: pytest.FixtureRequest) -> str:
    """The filter server's transport (``--transport``): every test runs on both."""
    return str(request.param)


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, redis_port: int, transport: str
) -> AsyncIterator[tuple[str, FilterApp, QuotaReader]]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    gw, fp, rp = free_port(), free_port(), free_port()
    replicas = [free_port() for _ in range(2)]
    children = [
        ChildProcess(
            [sys.executable, "-m", "backends.emulator", "--port", str(p), "--model", "m1",
             "--time-scale", "0.01", "--seed", str(i), "--log-level", "WARNING"],
            log=tmp_path / f"emulator{i}.log",
        )
        for i, p in enumerate(replicas)
    ]  # fmt: skip
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, redis_url, replicas), {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, None, {"ratelimit_service": rp}),
        ):
            app = FilterApp(
                Settings(policy_path=m.policy_path, redis_url=redis_url, transport=transport),
                clock=time.monotonic,
            )
            await app.start()
            yield (
                f"http://127.0.0.1:{gw}",
                app,
                QuotaReader(r, load_policy(m.policy_path), timeout=5.0),
            )
    finally:
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()
        await r.aclose()


async def test_openai_client_and_generate_against_the_emulator(
    tmp_path: Path, redis_port: int, transport: str
) -> None:
    async with stack(tmp_path, redis_port, transport) as (url, app, reader):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
            r = await client.chat.completions.create(
                model="m1",
                messages=[{"role": "user", "content": "Tell me about weirs."}],
                max_tokens=500,
            )
            assert (
                r.usage is not None and 1 <= r.usage.completion_tokens <= 12
            )  # clamped to the tier
            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "And rivers?"}], stream=True
            )
            chunks = [c async for c in stream]
            assert chunks and all(c.usage is None for c in chunks)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text.strip()
            stream = await client.chat.completions.create(
                model="m1",
                messages=[{"role": "user", "content": "And dams?"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/generate",
                json={"text": "a weir is", "sampling_params": {"max_new_tokens": 999}},
                headers={"authorization": f"Bearer {KEY}"},
            ) as resp,
        ):
            assert resp.status == 200
            meta = (await resp.json())["meta_info"]
            assert meta["completion_tokens"] <= 12
        # every request settled: the budget shows real usage, not 4 reservations of prompt + 12
        # (the filter server counts a request's usage when its gRPC stream closes, which can be
        # a moment after the client has the answer: poll both)
        m = app.metrics.registry

        def used() -> float:
            return sum(
                m.get_sample_value(
                    "tokenweir_filters_tokens_total", {"tenant": "erin", "model": "m1", "kind": k}
                )
                or 0
                for k in ("prompt", "completion")
            )

        left = None
        for _ in range(50):
            left = await reader.remaining("erin", "m1", "interactive")
            if left is not None and abs(left - (100000 - used())) <= 2:
                break
            await asyncio.sleep(0.1)
        assert used() > 0
        assert left is not None and abs(left - (100000 - used())) <= 2, (left, used())
