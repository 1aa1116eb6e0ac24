"""Real Envoy 1.40 fed by our ADS server over SotW and Delta gRPC (loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from google.protobuf import duration_pb2
from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.server import XdsServer
from controlplane.xds.snapshot import Snapshot
from tests.controlplane.xds import resources as r
from tests.controlplane.xds.live import Backend, backends, envoy, eventually, get_text
from tests.helpers import free_port
from tokenweir.envoy_launcher import EnvoyProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GROUP = "edge"


@dataclass
class Mesh:
    cache: SnapshotCache
    server: XdsServer
    registry: CollectorRegistry
    listen_port: int
    backends: list[Backend]
    session: aiohttp.ClientSession

    def publish(self, version: str, *ports: int, extra: tuple = ()) -> Snapshot:
        snap = r.snapshot(
            version,
            r.eds_cluster("pool"),
            r.cla("pool", ports),
            r.listener("in", self.listen_port, "rt"),
            r.route_config("rt", [("/", "pool")]),
            *extra,
        )
        self.cache.set_snapshot(GROUP, snap)
        return snap

    async def answer(self) -> tuple[int, str]:
        return await get_text(self.session, f"http://127.0.0.1:{self.listen_port}/v1/x")

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def mesh() -> AsyncIterator[Mesh]:
    async with backends("one", "two", "three") as servers, aiohttp.ClientSession() as session:
        registry = CollectorRegistry()
        cache = SnapshotCache()
        server = XdsServer(cache, registry=registry)
        await server.start()
        try:
            yield Mesh(cache, server, registry, free_port(), servers, session)
        finally:
            await server.aclose()


async def clusters_text(proxy: EnvoyProcess) -> str:
    return (await proxy.admin_get("/clusters"))[1]


async def stat(proxy: EnvoyProcess, name: str) -> str:
    body = (await proxy.admin_get(f"/stats?filter=^{name}$"))[1]
    return body.split(":", 1)[1].strip() if ":" in body else ""


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_routes_and_follows_endpoint_changes(tmp_path: Path, delta: bool) -> None:
    async with mesh() as m:
        one, two, three = m.backends
        m.publish("1", one.port)
        async with envoy(tmp_path, m.server.port, node_id="e1", group=GROUP, delta=delta) as proxy:
            assert await m.answer() == (200, "one")
            m.publish("2", one.port, two.port)  # add an endpoint

            async def both_listed() -> bool:
                text = await clusters_text(proxy)
                return f":{one.port}::" in text and f":{two.port}::" in text

            await eventually(both_listed, what="added endpoint in /clusters")
            m.publish("3", three.port)  # replace them

            async def only_three() -> bool:
                return {(await m.answer())[1] for _ in range(6)} == {"three"}

            await eventually(only_three, what="traffic on the new endpoint only")
            assert f":{one.port}::" not in await clusters_text(proxy)
            mode = "delta" if delta else "sotw"
            assert m.metric("tokenweir_xds_nacks_total", type="eds", mode=mode) == 0
            assert m.metric("tokenweir_xds_acks_total", type="eds", mode=mode) >= 3
            await asyncio.sleep(0.5)
            pushes = {
                t: m.metric("tokenweir_xds_pushes_total", type=t, mode=mode)
                for t in ("cds", "eds", "lds", "rds")
            }
            # One initial push per type and one EDS push per change: no loops, no extras.
            assert pushes == {"cds": 1, "eds": 3, "lds": 1, "rds": 1}, pushes
            assert m.metric("tokenweir_xds_connected_nodes", group=GROUP, mode=mode) == 1


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_invalid_resource_is_nacked_and_old_config_keeps_serving(
    tmp_path: Path, delta: bool
) -> None:
    async with mesh() as m:
        one, two, _ = m.backends
        m.publish("1", one.port)
        async with envoy(tmp_path, m.server.port, node_id="e1", group=GROUP, delta=delta) as proxy:
            assert await m.answer() == (200, "one")
            broken = r.eds_cluster("broken")
            broken.connect_timeout.CopyFrom(duration_pb2.Duration(seconds=-1))  # Envoy refuses
            m.publish("2", two.port, extra=(broken, r.cla("broken", [two.port])))
            mode = "delta" if delta else "sotw"

            async def nacked() -> bool:
                return m.metric("tokenweir_xds_nacks_total", type="cds", mode=mode) == 1

            await eventually(nacked, what="NACK of the broken cluster")
            assert await stat(proxy, "cluster_manager.cds.update_rejected") == "1"
            await asyncio.sleep(1.0)  # no resend loop, and later types wait
            assert m.metric("tokenweir_xds_pushes_total", type="cds", mode=mode) == 2
            assert m.metric("tokenweir_xds_nacks_total", type="cds", mode=mode) == 1
            assert await m.answer() == (200, "one")
            assert "broken" not in await clusters_text(proxy)
            m.publish("3", two.port)  # a fixed config goes through

            async def moved() -> bool:
                return (await m.answer())[1] == "two"

            await eventually(moved, what="the fixed snapshot")


async def test_three_envoys_at_once(tmp_path: Path) -> None:
    async with mesh() as m:
        one, two, _ = m.backends
        ports = [free_port() for _ in range(3)]
        async with contextlib.AsyncExitStack() as stack:
            proxies = []
            for i, port in enumerate(ports):
                group = f"g{i}"
                m.cache.set_snapshot(
                    group,
                    r.snapshot(
                        "1",
                        r.eds_cluster("pool"),
                        r.cla("pool", [one.port]),
                        r.listener("in", port, "rt"),
                        r.route_config("rt", [("/", "pool")]),
                    ),
                )
                proxies.append(
                    await stack.enter_async_context(
                        envoy(tmp_path, m.server.port, node_id=f"e{i}", group=group, delta=i == 1)
                    )
                )
            for port in ports:
                assert await get_text(m.session, f"http://127.0.0.1:{port}/") == (200, "one")
            for i, port in enumerate(ports):
                m.cache.set_snapshot(
                    f"g{i}",
                    r.snapshot(
                        "2",
                        r.eds_cluster("pool"),
                        r.cla("pool", [two.port]),
                        r.listener("in", port, "rt"),
                        r.route_config("rt", [("/", "pool")]),
                    ),
                )
            for port in ports:

                async def moved(port: int = port) -> bool:
                    return (await get_text(m.session, f"http://127.0.0.1:{port}/"))[1] == "two"

                await eventually(moved, what=f"Envoy on {port} following its group")
            connected = sum(
                m.metric("tokenweir_xds_connected_nodes", group=f"g{i}", mode=mode)
                for i in range(3)
                for mode in ("sotw", "delta")
            )
            assert connected == 3


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_restarted_control_plane_is_picked_up(tmp_path: Path, delta: bool) -> None:
    async with backends("one", "two") as (one, two), aiohttp.ClientSession() as session:
        listen = free_port()
        url = f"http://127.0.0.1:{listen}/"

        def snap(port: int) -> Snapshot:
            return r.snapshot(
                "1",  # the restarted server starts its versions again
                r.eds_cluster("pool"),
                r.cla("pool", [port]),
                r.listener("in", listen, "rt"),
                r.route_config("rt", [("/", "pool")]),
            )

        first_cache = SnapshotCache()
        first_cache.set_snapshot(GROUP, snap(one.port))
        first = XdsServer(first_cache, registry=CollectorRegistry())
        xds_port = await first.start()
        async with envoy(tmp_path, xds_port, node_id="e1", group=GROUP, delta=delta) as proxy:
            assert await get_text(session, url) == (200, "one")
            await first.aclose()
            await asyncio.sleep(0.5)
            assert await get_text(session, url) == (200, "one"), "Envoy keeps serving"
            assert await stat(proxy, "control_plane.connected_state") == "0"
            second_cache = SnapshotCache()
            second_cache.set_snapshot(GROUP, snap(two.port))
            second = XdsServer(second_cache, registry=CollectorRegistry())
            assert await second.start(port=xds_port) == xds_port
            try:

                async def moved() -> bool:
                    return (await get_text(session, url))[1] == "two"

                await eventually(moved, timeout=40, what="config of the restarted server")
                assert await stat(proxy, "control_plane.connected_state") == "1"
            finally:
                await second.aclose()


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_changed_cluster_and_endpoints_together(tmp_path: Path, delta: bool) -> None:
    """A modified EDS cluster is rebuilt by Envoy; it must not stall waiting for endpoints."""
    async with mesh() as m:
        one, two, _ = m.backends
        m.publish("1", one.port)
        async with envoy(tmp_path, m.server.port, node_id="e1", group=GROUP, delta=delta) as proxy:
            assert await m.answer() == (200, "one")
            slower = r.eds_cluster("pool", connect_timeout_ms=900)
            m.cache.set_snapshot(
                GROUP,
                r.snapshot(
                    "2",
                    slower,
                    r.cla("pool", [two.port]),
                    r.listener("in", m.listen_port, "rt"),
                    r.route_config("rt", [("/", "pool")]),
                ),
            )

            async def moved() -> bool:
                return (await m.answer())[1] == "two"

            took = await eventually(moved, timeout=10, what="new cluster and endpoints")
            assert took < 5, f"took {took:.1f}s: a cluster waited for its initial fetch timeout"
            assert (
                "0.900s"
                in (await proxy.admin_get("/config_dump?resource=dynamic_active_clusters"))[1]
            )
