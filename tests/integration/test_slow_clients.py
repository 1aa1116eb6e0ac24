"""Slow and idle clients are bounded (real Envoy, our control plane, loopback only): connections
that trickle their request head one byte at a time are closed after ``request_headers_timeout``,
silent ones after ``idle_timeout``, connections past ``max_connections`` at once, and good
requests keep being served meanwhile. On main, 800 trickling connections stayed open forever."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import free_port
from tests.integration.mesh_harness import close_backends, mesh, start_backends

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRICKLERS = 200
CAP = 260
HEAD = b"GET /svc/slow HTTP/1.1\r\nhost: x\r\nuser-agent: trickle\r\n\r\n"


def policy_text(gw: int, backend_port: int) -> str:
    return f"""
version: 1
services:
  svc: {{endpoints: [127.0.0.1:{backend_port}], retries: {{enabled: false}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    downstream: {{request_headers_timeout: 2s, idle_timeout: 8s, max_connections: {CAP}}}
    routes: [{{name: svc, service: svc, match: {{prefix: /svc/}}}}]
"""


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the gateway closes the connection within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while await reader.read(4096):
                pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


async def _trickle(port: int, stop: asyncio.Event) -> float | None:
    """Send the request head a byte every 0.25 s; the seconds until the gateway closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    try:
        for byte in HEAD:
            if stop.is_set():
                return None
            writer.write(bytes([byte]))
            with contextlib.suppress(OSError):
                await writer.drain()
            if await _closed(reader, 0.25):
                return time.monotonic() - start
        return None  # the whole head got through: it was never cut off
    finally:
        writer.close()


async def _good_requests(s: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[float]:
    took = []
    while not stop.is_set():
        start = time.monotonic()
        async with s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            assert r.status == 200, await r.text()
            await r.read()
        took.append(time.monotonic() - start)
        await asyncio.sleep(0.05)
    return took


async def test_trickling_idle_and_excess_connections_are_closed(tmp_path: Path) -> None:
    (backend,) = await start_backends(1)
    gw = free_port()
    try:
        async with mesh(tmp_path, policy_text(gw, backend.port), {"edge": gw}):
            stop = asyncio.Event()
            async with aiohttp.ClientSession() as s:
                good = asyncio.create_task(_good_requests(s, f"http://127.0.0.1:{gw}/svc/ok", stop))
                cut = await asyncio.gather(*(_trickle(gw, stop) for _ in range(TRICKLERS)))
                stop.set()
                took = await good
            # each head would need ~14 s at this pace; the gateway allows 2 s for it (the upper
            # bound leaves room for a busy machine)
            assert all(t is not None and 1.5 < t < 8.0 for t in cut), sorted(map(str, cut))[-5:]
            # every good request was served, none waited for the trickling ones
            assert len(took) >= 10 and statistics.median(took) < 0.5, (len(took), max(took))

            # silent connections: the cap closes the excess at once, the idle timeout the rest
            conns = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", gw) for _ in range(CAP + 20))
            )
            early = await asyncio.gather(*(_closed(r, 1.0) for r, _ in conns))
            assert 20 <= sum(early) <= 20 + 5, sum(early)
            late = await asyncio.gather(*(_closed(r, 12.0) for r, _ in conns))
            assert all(late)
            for _, w in conns:
                w.close()
            async with aiohttp.ClientSession() as s2, s2.get(f"http://127.0.0.1:{gw}/svc/ok") as r:
                assert r.status == 200  # room again
    finally:
        await close_backends([backend])
