"""Swapping clusters under a steady request loop fails no request (SotW and Delta)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.server import XdsServer
from controlplane.xds.snapshot import Snapshot
from tests.controlplane.xds import resources as r
from tests.controlplane.xds.live import backends, envoy, eventually, get_text
from tests.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_cluster_swaps_fail_no_request(tmp_path: Path, delta: bool) -> None:
    async with backends("a", "b", "c") as servers, aiohttp.ClientSession() as session:
        listen = free_port()
        url = f"http://127.0.0.1:{listen}/"

        def only(version: str, index: int) -> Snapshot:
            # Each version routes everything to a cluster of its own and drops the previous one.
            name = f"pool-{version}"
            return r.snapshot(
                version,
                r.eds_cluster(name),
                r.cla(name, [servers[index].port]),
                r.listener("in", listen, "rt"),
                r.route_config("rt", [("/", name)]),
            )

        cache = SnapshotCache()
        cache.set_snapshot("edge", only("0", 0))
        server = XdsServer(cache, registry=CollectorRegistry())
        port = await server.start()
        try:
            async with envoy(tmp_path, port, node_id="e1", group="edge", delta=delta) as proxy:
                statuses: list[int] = []
                seen: set[str] = set()
                stop = asyncio.Event()

                async def loop() -> None:
                    while not stop.is_set():
                        status, body = await get_text(session, url)
                        statuses.append(status)
                        seen.add(body)

                workers = [asyncio.create_task(loop()) for _ in range(4)]
                for version in range(1, 13):
                    cache.set_snapshot("edge", only(str(version), version % 3))
                    await asyncio.sleep(0.15)
                await asyncio.sleep(0.3)
                stop.set()
                await asyncio.gather(*workers)
                failed = [s for s in statuses if s != 200]
                assert len(statuses) > 100
                assert failed == [], f"{len(failed)} of {len(statuses)} requests failed"
                assert seen == {"a", "b", "c"}
                clusters = (await proxy.admin_get("/clusters"))[1]
                assert "pool-12::" in clusters and "pool-11::" not in clusters
        finally:
            await server.aclose()


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_new_route_configuration_fails_no_request_on_open_connections(
    tmp_path: Path, delta: bool
) -> None:
    """LDS swaps the route configuration (and drops the old cluster) under keep-alive traffic.

    Open connections stay on the draining listener and its old routes: the old cluster must
    outlive the drain, and go only when Envoy unsubscribes from the old route configuration.
    """
    async with backends("a", "b") as servers, aiohttp.ClientSession() as session:
        listen = free_port()
        url = f"http://127.0.0.1:{listen}/"

        def version(index: int) -> Snapshot:
            pool, routes = f"pool-{index}", f"routes-{index}"
            return r.snapshot(
                str(index),
                r.eds_cluster(pool),
                r.cla(pool, [servers[index].port]),
                r.listener("in", listen, routes),
                r.route_config(routes, [("/", pool)]),
            )

        cache = SnapshotCache()
        cache.set_snapshot("edge", version(0))
        server = XdsServer(cache, registry=CollectorRegistry())
        port = await server.start()
        try:
            async with envoy(
                tmp_path, port, node_id="e1", group="edge", delta=delta, drain_time_s=1
            ) as proxy:
                statuses: list[int] = []
                bodies: list[str] = []
                stop = asyncio.Event()

                async def loop() -> None:
                    while not stop.is_set():
                        status, body = await get_text(session, url)
                        statuses.append(status)
                        bodies.append(body)

                workers = [asyncio.create_task(loop()) for _ in range(3)]
                await asyncio.sleep(0.3)
                cache.set_snapshot("edge", version(1))

                async def old_cluster_gone() -> bool:
                    return "pool-0::" not in (await proxy.admin_get("/clusters"))[1]

                await eventually(old_cluster_gone, timeout=20, what="removal after the drain")
                await asyncio.sleep(0.3)
                stop.set()
                await asyncio.gather(*workers)
                failed = [s for s in statuses if s != 200]
                assert failed == [], f"{len(failed)} of {len(statuses)} requests failed"
                assert bodies[-1] == "b" and bodies[0] == "a"
        finally:
            await server.aclose()
