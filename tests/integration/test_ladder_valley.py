"""A batch runner's lines are no overload: the degradation ladder leaves them out.

Real Envoy, a real filter server and a real Redis; a fake control plane serves the pool's
saturation (``test_ladder_envoy``'s harness), and the runner's lines at the replicas are
written to Redis by the runner's own code (``Records.publish_valley``). A pool whose slots the
runner fills to 0.9 does not clamp the free tier's answers (its first step, at 0.8); the same
saturation without the runner's lines (the runner stopped, or its word too old) does."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from batch_service.records import Records
from filters.app import FilterApp, Settings
from poolstate.valley import MAX_AGE_S, RunnerWord, valley_key
from runtime.redis_connect import connect_redis
from tests.helpers import free_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_ladder_envoy import (
    KEYS,
    FakePoolState,
    ModelBackend,
    call,
    policy,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def batch_policy(gw: int, fp: int, cp: int, big: int, small: int, api: int) -> str:
    """``test_ladder_envoy``'s policy with a batch section filling pool ``chat``."""
    text = policy(gw, fp, cp, big, small)
    routes = """    routes:
      - name: batch-jobs
        match: {prefix: /v1/batches}
        service: batch-api
        filters: {plugins: [{name: identity, settings: {forward_authorization: true}}]}
      - name: batch-lines
        match: {prefix: /v1/, headers: {x-batch-line: "1"}}
        pool: chat
        lane: batch
        filters: {plugins: [identity, idempotency, lane, degrade, admission, tokens]}
"""
    text = text.replace("    routes:\n", routes, 1)
    return (
        text
        + f"""services:
  batch-api: {{endpoints: [127.0.0.1:{api}]}}
batch:
  service: batch-api
  gateway: edge
  pool: chat
"""
    )


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, redis_url: str
) -> AsyncIterator[tuple[str, FilterApp, FakePoolState, ModelBackend]]:
    big, small = ModelBackend("big"), ModelBackend("tiny")
    await big.start()
    await small.start()
    cp = FakePoolState(f"127.0.0.1:{big.port}")  # 8 running slots
    await cp.start()
    gw, fp = free_port(), free_port()
    text = batch_policy(gw, fp, cp.port, big.port, small.port, free_port())
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            settings = Settings(policy_path=m.policy_path, redis_url=redis_url)
            app = FilterApp(settings, clock=time.monotonic)
            await app.start()
            try:
                yield f"http://127.0.0.1:{gw}", app, cp, big
            finally:
                await app.aclose()
    finally:
        for c in (cp, big, small):
            await c.aclose()


async def test_the_runners_lines_do_not_clamp_the_free_tier(
    tmp_path: Path, redis_port: int
) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    redis = await connect_redis(url, timeout=2.0)
    await redis.delete(valley_key("chat"))
    records = Records(redis)
    try:
        async with stack(tmp_path, url) as (gw, app, cp, big), aiohttp.ClientSession() as s:
            step = lambda: app.ladders.step("chat")  # noqa: E731
            # 7 of the 8 slots busy, 6 of them the runner's lines: interactive holds 1 (0.125)
            await records.publish_valley("chat", "runner-0", RunnerWord(6, time.time()))
            cp.set(0.9)
            await until(lambda: app.ladders.level("chat") == pytest.approx(0.9 - 6 / 8))
            status, headers, _ = await call(s, gw, "free")
            assert status == 200 and big.bodies[-1]["max_tokens"] == 500
            assert "x-tokenweir-degraded" not in headers and step() == 0

            # the runner publishes again as its lines change; a second runner's count adds up
            await records.publish_valley("chat", "runner-1", RunnerWord(1, time.time()))
            await until(lambda: app.ladders.level("chat") == pytest.approx(0.9 - 7 / 8))

            # the runners stopped (they write 0): the same saturation is the pool's own
            now = time.time()
            await records.publish_valley("chat", "runner-0", RunnerWord(0, now))
            await records.publish_valley("chat", "runner-1", RunnerWord(0, now))
            await until(lambda: step() == 1)
            status, headers, _ = await call(s, gw, "free")
            assert status == 200 and big.bodies[-1]["max_tokens"] == 16
            assert headers["x-tokenweir-degraded"] == "clamp_max_tokens"
            status, _, _ = await call(s, gw, "pro")  # pro is never touched
            assert status == 200 and big.bodies[-1]["max_tokens"] == 500

            # a runner's word older than MAX_AGE_S (it died, or its clock is off) counts none
            await records.publish_valley(
                "chat", "runner-0", RunnerWord(6, time.time() - MAX_AGE_S - 1)
            )
            cp.set(0.85)
            await until(lambda: app.ladders.level("chat") == pytest.approx(0.85))
            assert step() == 1
    finally:
        await redis.delete(valley_key("chat"))
        await redis.aclose()


async def test_without_redis_the_ladder_reads_the_whole_saturation(tmp_path: Path) -> None:
    """No Redis configured: nothing is left out (the plain saturation, as before)."""
    async with stack(tmp_path, "") as (gw, app, cp, big), aiohttp.ClientSession() as s:
        cp.set(0.9)
        await until(lambda: app.ladders.step("chat") == 1)
        status, _, _ = await call(s, gw, "free")
        assert status == 200 and big.bodies[-1]["max_tokens"] == 16
    assert KEYS  # the same tenants as test_ladder_envoy
