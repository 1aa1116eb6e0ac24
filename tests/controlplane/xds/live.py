"""Real processes for xDS integration tests: tiny HTTP backends and Envoys fed by our server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.helpers import envoy_base_id, free_port
from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings

__all__ = ["Backend", "backends", "envoy", "eventually", "get_text"]


@dataclass(frozen=True)
class Backend:
    tag: str
    port: int


@contextlib.asynccontextmanager
async def backends(*tags: str) -> AsyncIterator[list[Backend]]:
    """One aiohttp server per tag on a free loopback port; each answers its tag."""
    runners: list[web.AppRunner] = []
    out: list[Backend] = []
    try:
        for tag in tags:
            app = web.Application()

            async def answer(_: web.Request, tag: str = tag) -> web.Response:
                return web.Response(text=tag)

            app.router.add_route("*", "/{tail:.*}", answer)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            runners.append(runner)
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            out.append(Backend(tag, port))
        yield out
    finally:
        for runner in runners:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def envoy(
    work_dir: Path,
    xds_port: int,
    *,
    node_id: str,
    group: str,
    delta: bool,
    drain_time_s: int = 5,
) -> AsyncIterator[EnvoyProcess]:
    settings = EnvoySettings(
        node_id=node_id,
        node_cluster=group,
        xds_port=xds_port,
        base_id=envoy_base_id(),
        delta=delta,
        log_level="info",
        drain_time_s=drain_time_s,
    )
    process = EnvoyProcess(settings, work_dir)
    try:
        await process.start(timeout=30)
        yield process
    finally:
        await process.aclose()


async def get_text(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, what: str = "condition"
) -> float:
    """Poll ``check`` until true; return the seconds it took; fail after ``timeout``."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start
