"""The degradation ladder on real Envoy and a real filter server: a fake control plane serves
crafted pool state (``GET /api/v1/pools``), two model backends answer with the model they serve.
As the primary pool's saturation rises, lower tiers are clamped, sent to the fallback pool
(the response names its model), then shed; the ladder comes back down with hysteresis; the
interactive tier is never touched."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from filters.app import FilterApp, Settings
from runtime.local_http import serve_any_path
from tests.helpers import free_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEYS = {"pro": "pro-key-12345", "free": "free-key-1234"}


@dataclass
class ModelBackend:
    """Answers a chat completion with the model it serves; records the bodies it got."""

    model: str
    port: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.port = await serve_any_path(self._handle, "127.0.0.1")

    async def _handle(self, request: web.Request) -> web.Response:
        if not request.path.startswith("/v1/"):
            return web.Response(status=404)
        body = await request.json()
        self.bodies.append(body)
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": self.model,  # what SGLang reports: the model it serves
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )  # fmt: skip

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class FakePoolState:
    """The control plane's pool-state API with a saturation the test sets."""

    endpoint: str
    level: float = 0.0
    version: int = 1
    port: int = 0
    _runner: web.AppRunner | None = None

    def set(self, level: float) -> None:
        self.level, self.version = level, self.version + 1

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pools", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        if request.query.get("after_version") == str(self.version):
            await asyncio.sleep(0.1)  # a short long-poll: nothing new
        replica = {"s": self.level, "run": 0, "q": 0, "kv": 0.0, "tput": 0.0, "hit": 0.0,
                   "ok": True, "stale": False, "deg": False, "age": 0.0}  # fmt: skip
        pool = {"capacity_running": 8, "capacity_queued": 8, "endpoints": {self.endpoint: replica}}
        return web.json_response(
            {"version": self.version, "ts": time.time(), "pools": {"chat": pool}}
        )

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def policy(gw: int, fp: int, cp: int, big: int, small: int) -> str:
    off = "health_check: {enabled: false}, retries: {enabled: false}, " \
          "outlier_detection: {enabled: false}"  # fmt: skip
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:{cp}}}
filters: {{address: 127.0.0.1:{fp}}}
pools:
  chat:
    models: [big]
    endpoints: [127.0.0.1:{big}]
    fallback: small
    {off.replace(", ", chr(10) + "    ")}
    degradation:
      min_dwell: 1s
      steps:
        - {{action: clamp_max_tokens, enter_at: 0.8, leave_at: 0.6, tiers: [free], max_tokens: 16}}
        - {{action: fallback, enter_at: 1.0, leave_at: 0.8, tiers: [free]}}
        - {{action: shed, enter_at: 1.5, leave_at: 1.2, lanes: [batch]}}
  small:
    models: [tiny]
    endpoints: [127.0.0.1:{small}]
    {off.replace(", ", chr(10) + "    ")}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [identity, lane, degrade, tokens]}}
tiers:
  free: {{lane: batch, allowed_lanes: [batch], max_tokens: 1000}}
  pro: {{lane: interactive, max_tokens: 1000}}
tenants:
  pro: {{tier: pro, api_keys: [{KEYS["pro"]}]}}
  free: {{tier: free, api_keys: [{KEYS["free"]}]}}
"""


Response = tuple[int, dict[str, str], dict[str, Any]]


async def call(s: aiohttp.ClientSession, url: str, who: str) -> Response:
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}
    async with s.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEYS[who]}"},
        timeout=aiohttp.ClientTimeout(total=20),
    ) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.json()


async def until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[tuple[str, FilterApp, FakePoolState, ModelBackend, ModelBackend]]:  # fmt: skip
    big, small = ModelBackend("big"), ModelBackend("tiny")
    await big.start()
    await small.start()
    cp = FakePoolState(f"127.0.0.1:{big.port}")
    await cp.start()
    gw, fp = free_port(), free_port()
    text = policy(gw, fp, cp.port, big.port, small.port)
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            try:
                yield f"http://127.0.0.1:{gw}", app, cp, big, small
            finally:
                await app.aclose()
    finally:
        for c in (cp, big, small):
            await c.aclose()


async def test_ladder_clamps_falls_back_sheds_and_steps_down(tmp_path: Path) -> None:
    async with stack(tmp_path) as (url, app, cp, big, small), aiohttp.ClientSession() as s:
        step = lambda: app.ladders.step("chat")  # noqa: E731
        # normal service
        status, headers, body = await call(s, url, "free")
        assert status == 200 and body["model"] == "big" and big.bodies[-1]["max_tokens"] == 500
        assert "x-tokenweir-degraded" not in headers

        # step 1: the free tier's max_tokens is clamped; pro is untouched
        cp.set(0.9)
        await until(lambda: step() == 1)
        status, headers, body = await call(s, url, "free")
        assert status == 200 and big.bodies[-1]["max_tokens"] == 16
        assert headers["x-tokenweir-degraded"] == "clamp_max_tokens"
        status, headers, body = await call(s, url, "pro")
        assert status == 200 and big.bodies[-1]["max_tokens"] == 500
        assert "x-tokenweir-degraded" not in headers

        # step 2: the free tier goes to the fallback pool, whose model answers
        cp.set(1.1)
        await until(lambda: step() == 2)
        served_before = len(small.bodies)
        status, headers, body = await call(s, url, "free")
        assert status == 200, body
        assert body["model"] == "tiny" and len(small.bodies) == served_before + 1
        assert small.bodies[-1]["model"] == "tiny" and small.bodies[-1]["max_tokens"] == 16
        assert headers["x-tokenweir-served-model"] == "tiny"
        assert headers["x-tokenweir-degraded"] == "clamp_max_tokens,fallback"
        status, headers, body = await call(s, url, "pro")
        assert status == 200 and body["model"] == "big"

        # step 3: the batch lane is shed with Retry-After and a JSON reason; pro still served
        cp.set(1.6)
        await until(lambda: step() == 3)
        status, headers, body = await call(s, url, "free")
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert body["error"]["code"] == "degraded"
        status, _, body = await call(s, url, "pro")
        assert status == 200 and body["model"] == "big"

        # noise inside the shed band long past the dwell: no change
        cp.set(1.3)
        await asyncio.sleep(1.5)
        assert step() == 3
        # down: below the fallback's leave_at, above the clamp's → step 1 after the dwell
        cp.set(0.7)
        await until(lambda: step() == 1)
        status, headers, body = await call(s, url, "free")
        assert status == 200 and body["model"] == "big" and big.bodies[-1]["max_tokens"] == 16
        cp.set(0.1)
        await until(lambda: step() == 0)
        status, headers, body = await call(s, url, "free")
        assert status == 200 and big.bodies[-1]["max_tokens"] == 500
        assert "x-tokenweir-degraded" not in headers

        text = generate_latest(app.metrics.registry).decode()
        assert 'tokenweir_filters_ladder_step{pool="chat"} 0.0' in text
        assert 'tokenweir_filters_ladder_changes_total{direction="up",pool="chat"} 3.0' in text
        assert 'tokenweir_filters_ladder_changes_total{direction="down",pool="chat"} 2.0' in text
        assert 'tokenweir_filters_ladder_requests_total{action="shed",pool="chat"} 1.0' in text
