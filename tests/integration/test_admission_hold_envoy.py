"""Admission on real Envoy when the filter server is late: a queued request's answer (admitted,
or shed with Retry-After) must still beat Envoy's ext_proc timer, or the client gets Envoy's own
504 without Retry-After. The filter server runs on the test's event loop, so blocking the loop
is a filter server whose loop is behind (a loaded machine)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import free_port
from tests.integration import test_admission_envoy as adm
from tests.integration.mesh_harness import Mesh, mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def policy(gw: int, fp: int, backend: int) -> str:
    """One slot; message_timeout 200 ms, interactive max_wait 400 ms."""
    text = adm.policy(gw, fp, backend, cap=1)
    text = text.replace("message_timeout: 500ms", "message_timeout: 200ms")
    return text.replace(
        "interactive: {ttft_budget: 20s, max_wait: 10s",
        "interactive: {ttft_budget: 20s, max_wait: 400ms",
    )


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, b: adm.HoldBackend) -> AsyncIterator[tuple[adm.Gateway, Mesh]]:
    gw, fp = free_port(), free_port()
    async with mesh(tmp_path, policy(gw, fp, b.port), {"edge": gw}) as m:
        app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
        await app.start()
        try:
            yield adm.Gateway(f"http://127.0.0.1:{gw}", app), m
        finally:
            await app.aclose()


async def envoy_stat(m: Mesh, name: str) -> int:
    _, text = await m.envoys["edge"].admin_get("/stats?filter=ext_proc")
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key.endswith(name):
            return int(value)
    raise AssertionError(f"no stat {name}")


async def test_a_late_shed_answer_still_carries_retry_after(tmp_path: Path) -> None:
    async with (
        adm.started_backend() as b,
        gateway(tmp_path, b) as (g, m),
        aiohttp.ClientSession() as s,
    ):
        held = asyncio.create_task(adm.call(s, g.url, "alice"))
        await adm.until(lambda: b.running == 1)
        waiting = asyncio.create_task(adm.call(s, g.url, "erin"))
        await adm.until(lambda: adm.queued(g, "interactive") == 1)
        # Envoy got the filter server's override_message_timeout (the wait + the answer's slack)
        end = time.monotonic() + 5
        while await envoy_stat(m, "override_message_timeout_received") < 1:
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        # the loop stalls across the end of the wait (400 ms) and past it by more than the
        # message timeout (200 ms): the shed answer is written ~400 ms late
        time.sleep(0.8)
        adm.assert_shed(await waiting, 503, "timed_out")
        assert await envoy_stat(m, "message_timeouts") == 0
        b.hold = False
        b.release(2)
        assert (await held)[0] == 200
