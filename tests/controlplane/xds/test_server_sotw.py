"""State-of-the-World ADS on fakes: push order, ACK/NACK, stale nonces, updates, removals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.metrics import XdsMetrics
from controlplane.xds.server import AdsServicer
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.controlplane.xds import resources as r
from tests.controlplane.xds.fakes import FakeStream, ManualClock, node, sotw_request

Response = discovery_pb2.DiscoveryResponse


def mesh(version: str, *, pools: dict[str, list[int]], routes: list[tuple[str, str]]) -> Snapshot:
    items: list = []
    for pool, ports in pools.items():
        items += [r.eds_cluster(pool), r.cla(pool, ports)]
    items += [r.listener("in", 10000, "rt"), r.route_config("rt", routes)]
    return r.snapshot(version, *items)


class Harness:
    def __init__(self) -> None:
        self.cache = SnapshotCache()
        self.registry = CollectorRegistry()
        self.clock = ManualClock()
        self.servicer = AdsServicer(self.cache, XdsMetrics(self.registry), clock=self.clock)

    def stream(self) -> FakeStream:
        return FakeStream(self.servicer.StreamAggregatedResources)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"mode": "sotw", **labels}) or 0.0


def names(response: Response) -> list[str]:
    out = []
    for packed in response.resources:
        if packed.type_url == CLUSTER:
            message: cluster_pb2.Cluster | route_pb2.RouteConfiguration = cluster_pb2.Cluster()
        else:
            message = route_pb2.RouteConfiguration()
        packed.Unpack(message)
        out.append(message.name)
    return out


async def sync(stream: FakeStream) -> dict[str, Response]:
    """Play Envoy's initial handshake; return the last response of each type."""
    got: dict[str, Response] = {}
    stream.send(sotw_request(CLUSTER, who=node()))
    got[CLUSTER] = await stream.recv()
    stream.send(sotw_request(ENDPOINT, ["pool"]))
    # Envoy holds its CDS ACK until new clusters got endpoints, so EDS goes out first.
    got[ENDPOINT] = await stream.recv()
    stream.send(sotw_request(LISTENER))
    await stream.silent()  # LDS waits for the CDS ACK
    stream.send(sotw_request(CLUSTER, nonce=got[CLUSTER].nonce, version=got[CLUSTER].version_info))
    await stream.silent()  # ... and for the EDS ACK
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=got[ENDPOINT].nonce, version="1"))
    got[LISTENER] = await stream.recv()
    stream.send(sotw_request(LISTENER, nonce=got[LISTENER].nonce, version="1"))
    stream.send(sotw_request(ROUTE, ["rt"]))
    got[ROUTE] = await stream.recv()
    stream.send(sotw_request(ROUTE, ["rt"], nonce=got[ROUTE].nonce, version="1"))
    await stream.silent()
    return got


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    yield Harness()


async def test_initial_push_follows_cds_eds_lds_rds(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [8001]}, routes=[("/", "pool")]))
    stream = harness.stream()
    got = await sync(stream)
    assert [got[t].type_url for t in (CLUSTER, ENDPOINT, LISTENER, ROUTE)] == [
        CLUSTER,
        ENDPOINT,
        LISTENER,
        ROUTE,
    ]
    assert {g.version_info for g in got.values()} == {"1"}
    assert len({g.nonce for g in got.values()}) == 4
    assert harness.metric("tokenweir_xds_acks_total", type="cds") == 1
    assert harness.metric("tokenweir_xds_pushes_total", type="rds") == 1
    assert harness.metric("tokenweir_xds_connected_nodes", group="edge") == 1
    await stream.close()
    assert harness.metric("tokenweir_xds_connected_nodes", group="edge") == 0


async def test_stream_waits_for_first_snapshot(harness: Harness) -> None:
    stream = harness.stream()
    stream.send(sotw_request(CLUSTER, who=node()))
    await stream.silent()
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [1]}, routes=[("/", "pool")]))
    assert (await stream.recv()).type_url == CLUSTER
    await stream.close()


async def test_endpoint_change_pushes_only_eds(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [8001]}, routes=[("/", "pool")]))
    stream = harness.stream()
    await sync(stream)
    harness.clock.now += 1
    harness.cache.set_snapshot("edge", mesh("2", pools={"pool": [8002]}, routes=[("/", "pool")]))
    update = await stream.recv()
    assert (update.type_url, update.version_info) == (ENDPOINT, "2")
    harness.clock.now += 0.25
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=update.nonce, version="2"))
    await stream.silent()
    latency_sum = harness.metric("tokenweir_xds_push_ack_seconds_sum", type="eds")
    assert latency_sum == pytest.approx(0.25)
    await stream.close()


async def test_nack_keeps_last_accepted_and_is_not_resent(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [8001]}, routes=[("/", "pool")]))
    stream = harness.stream()
    await sync(stream)
    bad = mesh("2", pools={"pool": [8001], "extra": [8003]}, routes=[("/", "pool")])
    harness.cache.set_snapshot("edge", bad)
    cds = await stream.recv()
    assert (cds.type_url, cds.version_info) == (CLUSTER, "2")
    with caplog.at_level(logging.WARNING):
        stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="1", error="bad cluster extra"))
        await stream.silent(0.1)  # no resend of version 2, nothing later in the order either
    assert harness.metric("tokenweir_xds_nacks_total", type="cds") == 1
    assert "bad cluster extra" in caplog.text and "stays on version '1'" in caplog.text
    # Envoy repeating its last request does not start a loop either.
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="1", error="bad cluster extra"))
    await stream.silent()
    # A new snapshot is tried.
    harness.cache.set_snapshot("edge", mesh("3", pools={"pool": [8009]}, routes=[("/", "pool")]))
    retry = await stream.recv()
    assert retry.type_url == ENDPOINT and retry.version_info == "3"
    assert harness.metric("tokenweir_xds_nacks_total", type="cds") == 1
    await stream.close()


async def test_stale_nonce_is_ignored(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [8001]}, routes=[("/", "pool")]))
    stream = harness.stream()
    first = await sync(stream)
    harness.cache.set_snapshot("edge", mesh("2", pools={"pool": [8002]}, routes=[("/", "pool")]))
    update = await stream.recv()
    # An answer to the older EDS response (even a NACK) changes nothing.
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=first[ENDPOINT].nonce, error="old"))
    await stream.silent()
    assert harness.metric("tokenweir_xds_stale_nonces_total", type="eds") == 1
    assert harness.metric("tokenweir_xds_nacks_total", type="eds") == 0
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=update.nonce, version="2"))
    await stream.silent()
    assert harness.metric("tokenweir_xds_acks_total", type="eds") == 2
    await stream.close()


async def test_removed_cluster_stays_until_routes_stop_using_it(harness: Harness) -> None:
    two = mesh("1", pools={"pool": [1], "old": [2]}, routes=[("/old", "old"), ("/", "pool")])
    harness.cache.set_snapshot("edge", two)
    stream = harness.stream()
    stream.send(sotw_request(CLUSTER, who=node()))
    cds = await stream.recv()
    assert sorted(names(cds)) == ["old", "pool"]
    stream.send(sotw_request(ENDPOINT, ["old", "pool"]))
    eds = await stream.recv()
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="1"))
    stream.send(sotw_request(ENDPOINT, ["old", "pool"], nonce=eds.nonce, version="1"))
    stream.send(sotw_request(LISTENER))
    lds = await stream.recv()
    stream.send(sotw_request(LISTENER, nonce=lds.nonce, version="1"))
    stream.send(sotw_request(ROUTE, ["rt"]))
    rds = await stream.recv()
    stream.send(sotw_request(ROUTE, ["rt"], nonce=rds.nonce, version="1"))
    await stream.silent()

    harness.cache.set_snapshot("edge", mesh("2", pools={"pool": [1]}, routes=[("/", "pool")]))
    first = await stream.recv()
    assert first.type_url == ROUTE, "routes must stop using 'old' before it is removed"
    await stream.silent()  # the removal waits for the route ACK
    stream.send(sotw_request(ROUTE, ["rt"], nonce=first.nonce, version="2"))
    removal = await stream.recv()
    assert (removal.type_url, names(removal)) == (CLUSTER, ["pool"])
    stream.send(sotw_request(CLUSTER, nonce=removal.nonce, version="2"))
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=eds.nonce, version="1"))  # unsubscribes
    await stream.silent()
    assert harness.metric("tokenweir_xds_stale_nonces_total", type="eds") == 0
    await stream.close()


async def test_added_cluster_reaches_envoy_before_the_route_using_it(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [1]}, routes=[("/", "pool")]))
    stream = harness.stream()
    first = await sync(stream)
    harness.cache.set_snapshot(
        "edge", mesh("2", pools={"pool": [1], "new": [3]}, routes=[("/new", "new"), ("/", "pool")])
    )
    cds = await stream.recv()
    assert cds.type_url == CLUSTER and sorted(names(cds)) == ["new", "pool"]
    await stream.silent()  # no route to "new" before Envoy has the cluster
    stream.send(sotw_request(ENDPOINT, ["new", "pool"], nonce=first[ENDPOINT].nonce, version="1"))
    eds = await stream.recv()  # the new cluster warms with these, before Envoy ACKs the CDS
    assert eds.type_url == ENDPOINT and len(eds.resources) == 2
    stream.send(sotw_request(ENDPOINT, ["new", "pool"], nonce=eds.nonce, version="2"))
    await stream.silent()  # routes wait for the CDS ACK
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="2"))
    rds = await stream.recv()
    assert rds.type_url == ROUTE
    await stream.close()


async def test_several_envoys_each_get_their_group(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", mesh("e1", pools={"pool": [1]}, routes=[("/", "pool")]))
    harness.cache.set_snapshot("side", mesh("s1", pools={"pool": [2]}, routes=[("/", "pool")]))
    streams = [harness.stream() for _ in range(3)]
    groups = ["edge", "edge", "side"]
    for i, (stream, group) in enumerate(zip(streams, groups, strict=True)):
        stream.send(sotw_request(CLUSTER, who=node(f"n{i}", group)))
    versions = [(await s.recv()).version_info for s in streams]
    assert versions == ["e1", "e1", "s1"]
    assert harness.metric("tokenweir_xds_connected_nodes", group="edge") == 2
    for stream in streams:
        await stream.close()


async def test_repeated_request_is_answered_for_a_rebuilt_cluster(harness: Harness) -> None:
    """SotW Envoy re-sends its EDS request (same nonce) when it rebuilds a changed cluster."""
    harness.cache.set_snapshot("edge", mesh("1", pools={"pool": [1]}, routes=[("/", "pool")]))
    stream = harness.stream()
    got = await sync(stream)
    changed = mesh("2", pools={"pool": [1]}, routes=[("/", "pool")])
    slower = r.eds_cluster("pool", connect_timeout_ms=900)
    harness.cache.set_snapshot(
        "edge", Snapshot("2", {**changed.resources, CLUSTER: {"pool": slower}})
    )
    cds = await stream.recv()
    assert cds.type_url == CLUSTER
    first = await stream.recv()  # sent unasked: the rebuilt cluster needs its endpoints
    assert first.type_url == ENDPOINT
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=first.nonce, version="2"))
    stream.send(sotw_request(ENDPOINT, ["pool"], nonce=first.nonce, version="2"))  # asks again
    again = await stream.recv()
    assert again.type_url == ENDPOINT and again.nonce != first.nonce
    assert got[ENDPOINT].version_info == "1"
    await stream.close()


def test_published_snapshot_version_is_a_metric() -> None:
    from controlplane.xds.server import XdsServer

    cache = SnapshotCache()
    cache.set_snapshot("edge", mesh("v1", pools={"pool": [1]}, routes=[("/", "pool")]))
    registry = CollectorRegistry()
    XdsServer(cache, registry=registry)  # not started: no port is opened
    cache.set_snapshot("side", mesh("s7", pools={"pool": [2]}, routes=[("/", "pool")]))
    info = "tokenweir_xds_snapshot_info"
    assert registry.get_sample_value(info, {"group": "edge", "version": "v1"}) == 1
    assert registry.get_sample_value(info, {"group": "side", "version": "s7"}) == 1
    resources = registry.get_sample_value(
        "tokenweir_xds_snapshot_resources", {"group": "side", "type": "cds"}
    )
    assert resources == 1


async def test_cluster_of_a_still_subscribed_route_is_kept(harness: Harness) -> None:
    """A draining listener keeps its old route configuration subscribed, and so its cluster."""

    def version(index: int) -> Snapshot:
        pool, routes = f"pool-{index}", f"rt-{index}"
        return r.snapshot(
            str(index),
            r.eds_cluster(pool),
            r.cla(pool, [index]),
            r.listener("in", 10000, routes),
            r.route_config(routes, [("/", pool)]),
        )

    harness.cache.set_snapshot("edge", version(0))
    stream = harness.stream()
    stream.send(sotw_request(CLUSTER, who=node()))
    cds = await stream.recv()
    stream.send(sotw_request(ENDPOINT, ["pool-0"]))
    eds = await stream.recv()
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="0"))
    stream.send(sotw_request(ENDPOINT, ["pool-0"], nonce=eds.nonce, version="0"))
    stream.send(sotw_request(LISTENER))
    lds = await stream.recv()
    stream.send(sotw_request(LISTENER, nonce=lds.nonce, version="0"))
    stream.send(sotw_request(ROUTE, ["rt-0"]))
    rds = await stream.recv()
    stream.send(sotw_request(ROUTE, ["rt-0"], nonce=rds.nonce, version="0"))
    await stream.silent()

    harness.cache.set_snapshot("edge", version(1))
    cds = await stream.recv()
    assert sorted(names(cds)) == ["pool-0", "pool-1"]
    stream.send(sotw_request(ENDPOINT, ["pool-0", "pool-1"], nonce=eds.nonce, version="0"))
    eds = await stream.recv()
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="1"))
    stream.send(sotw_request(ENDPOINT, ["pool-0", "pool-1"], nonce=eds.nonce, version="1"))
    lds = await stream.recv()
    stream.send(sotw_request(ROUTE, ["rt-0", "rt-1"], nonce=rds.nonce, version="0"))
    stream.send(sotw_request(LISTENER, nonce=lds.nonce, version="1"))
    rds = await stream.recv()
    assert names(rds) == ["rt-1"]
    stream.send(sotw_request(ROUTE, ["rt-0", "rt-1"], nonce=rds.nonce, version="1"))
    await stream.silent()  # rt-0 (draining listener) still names pool-0: no removal yet
    stream.send(sotw_request(ROUTE, ["rt-1"], nonce=rds.nonce, version="1"))  # drain over
    removal = await stream.recv()
    assert (removal.type_url, names(removal)) == (CLUSTER, ["pool-1"])
    await stream.close()
