"""The saturation signal end to end: real emulators, the control plane's scraper and API on a
loopback port, and the reader a service runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from controlplane.saturation.api import pool_routes
from controlplane.saturation.fetch import HttpFetcher
from controlplane.saturation.scraper import PoolScraper
from controlplane.saturation.targets import PoolTargets, ScrapeSettings
from poolstate import SATURATED, Capacity, Hysteresis, PoolState, PoolSummary
from poolstate.reader import PoolStateReader, pools_url
from runtime.metrics_http import MetricsServer

pytestmark = pytest.mark.integration


async def _until(reader: PoolStateReader, ok, timeout: float = 10.0) -> PoolState:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = reader.state
        if ok(state):
            return state
        await reader.wait_update(0.2)
    raise AssertionError(f"condition not met; last state {reader.state.to_json()}")


@pytest.fixture
async def emulators() -> AsyncIterator[list[EmulatorServer]]:
    settings = EmulatorSettings(
        profile="seed-2k", time_scale=1.0, max_running_requests=2, max_queued_requests=4
    )
    servers = [await start_emulator(settings), await start_emulator(settings)]
    yield servers
    for s in servers:
        await s.aclose()


async def test_a_queue_on_one_replica_reaches_a_reader_and_a_dead_replica_reads_stale(
    emulators: list[EmulatorServer],
) -> None:
    a, b = (f"127.0.0.1:{s.port}" for s in emulators)
    scraper = PoolScraper(HttpFetcher(), clock=time.monotonic, wall_clock=time.time)
    scraper.configure(
        ScrapeSettings(interval_s=0.05, timeout_s=0.5, stale_after_s=0.5),
        {"chat": PoolTargets((a, b), Capacity(), Hysteresis(1.0, 0.8))},
    )
    api = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, routes=pool_routes(scraper))
    port = await api.start()
    reader = PoolStateReader(pools_url("127.0.0.1", port), clock=time.monotonic, poll_timeout_s=1)
    scraper.start()
    reader.start()
    load: list[asyncio.Task[None]] = []
    try:
        state = await _until(reader, lambda s: "chat" in s.pools and s.pools["chat"].fresh != [])
        assert state.pools["chat"].capacity_running == 4  # 2 + 2 from /get_server_info

        async def hold(http: aiohttp.ClientSession) -> None:
            body = {"text": "hello there", "sampling_params": {"max_new_tokens": 4000}}
            async with http.post(f"http://{a}/generate", json={**body, "stream": True}) as r:
                async for _ in r.content:
                    pass

        async with aiohttp.ClientSession() as http:
            load = [asyncio.create_task(hold(http)) for _ in range(2)]
            await _until(reader, lambda s: s.pools["chat"].endpoints[a].running == 2)
            load += [asyncio.create_task(hold(http)) for _ in range(3)]
            state = await _until(reader, lambda s: s.pools["chat"].endpoints[a].queued == 3)
            rep = state.pools["chat"].endpoints[a]
            assert rep.running == 2 and rep.saturation == pytest.approx(1.75)
            assert rep.degraded and not state.pools["chat"].endpoints[b].degraded
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
        state = await _until(reader, lambda s: s.pools["chat"].endpoints[a].saturation < 0.8)
        assert not state.pools["chat"].endpoints[a].degraded

        await emulators[1].aclose()
        state = await _until(reader, lambda s: s.pools["chat"].endpoints[b].stale)
        assert state.pools["chat"].endpoints[b].saturation == SATURATED
        assert state.pools["chat"].capacity_running == 2
    finally:
        for task in load:
            task.cancel()
        await reader.aclose()
        await scraper.aclose()
        await api.aclose()


async def test_the_control_plane_serves_its_pool_state_next_to_metrics(
    emulators: list[EmulatorServer], tmp_path: Path
) -> None:
    from controlplane.app import ControlPlane, ControlPlaneSettings
    from policy import Address
    from tests.helpers import free_port

    eps = ", ".join(f"'127.0.0.1:{s.port}'" for s in emulators)
    policy = tmp_path / "mesh.yaml"
    policy.write_text(
        "version: 1\ncontrol_plane: {pool_state: {interval: 50ms}}\n"
        f"pools:\n  chat:\n    models: [m]\n    endpoints: [{eps}]\n"
        "    capacity: {max_running_requests: 1}\n"
    )
    metrics = Address("127.0.0.1", free_port())
    plane = ControlPlane(ControlPlaneSettings(policy, Address("127.0.0.1", 0), metrics))
    await plane.start()
    reader = PoolStateReader(pools_url(metrics.host, metrics.port), clock=time.monotonic)
    reader.start()
    try:
        state = await _until(reader, lambda s: len(s.pools.get("chat", PoolSummary()).fresh) == 2)
        assert state.pools["chat"].capacity_running == 2  # the policy's 1 per replica wins
    finally:
        await reader.aclose()
        await plane.aclose()
