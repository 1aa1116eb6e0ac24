"""Delta ADS on fakes: only changes travel, removals come last, NACK, stale nonces, reconnects."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.metrics import XdsMetrics
from controlplane.xds.server import AdsServicer
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.controlplane.xds import resources as r
from tests.controlplane.xds.fakes import FakeStream, ManualClock, delta_request, node

Response = discovery_pb2.DeltaDiscoveryResponse


def mesh(version: str, pools: dict[str, list[int]], routes: list[tuple[str, str]]) -> Snapshot:
    items: list = []
    for pool, ports in pools.items():
        items += [r.eds_cluster(pool), r.cla(pool, ports)]
    items += [r.listener("in", 10000, "rt"), r.route_config("rt", routes)]
    return r.snapshot(version, *items)


TWO = mesh("1", {"a": [1], "b": [2]}, [("/b", "b"), ("/", "a")])


class Harness:
    def __init__(self) -> None:
        self.cache = SnapshotCache()
        self.registry = CollectorRegistry()
        self.servicer = AdsServicer(self.cache, XdsMetrics(self.registry), clock=ManualClock())

    def stream(self) -> FakeStream:
        return FakeStream(self.servicer.DeltaAggregatedResources)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"mode": "delta", **labels}) or 0.0


def sent(response: Response) -> list[str]:
    return [resource.name for resource in response.resources]


async def sync(stream: FakeStream, clas: list[str]) -> dict[str, Response]:
    got: dict[str, Response] = {}
    stream.send(delta_request(CLUSTER, who=node()))
    got[CLUSTER] = await stream.recv()
    stream.send(delta_request(ENDPOINT, clas))
    got[ENDPOINT] = await stream.recv()
    stream.send(delta_request(LISTENER))
    stream.send(delta_request(ENDPOINT, nonce=got[ENDPOINT].nonce))
    await stream.silent()  # listeners wait for the CDS ACK
    stream.send(delta_request(CLUSTER, nonce=got[CLUSTER].nonce))
    got[LISTENER] = await stream.recv()
    stream.send(delta_request(LISTENER, nonce=got[LISTENER].nonce))
    stream.send(delta_request(ROUTE, ["rt"]))
    got[ROUTE] = await stream.recv()
    stream.send(delta_request(ROUTE, nonce=got[ROUTE].nonce))
    await stream.silent()
    return got


@pytest.fixture
def harness() -> Harness:
    return Harness()


async def test_initial_push_order_and_resource_versions(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    got = await sync(stream, ["a", "b"])
    assert sent(got[CLUSTER]) == ["a", "b"] and sent(got[ENDPOINT]) == ["a", "b"]
    assert sent(got[LISTENER]) == ["in"] and sent(got[ROUTE]) == ["rt"]
    assert got[CLUSTER].resources[0].version == TWO.versions[CLUSTER]["a"]
    assert got[CLUSTER].system_version_info == "1"
    assert harness.metric("tokenweir_xds_acks_total", type="rds") == 1
    await stream.close()


async def test_only_the_changed_resource_is_sent(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    await sync(stream, ["a", "b"])
    harness.cache.set_snapshot("edge", mesh("2", {"a": [1], "b": [7]}, [("/b", "b"), ("/", "a")]))
    update = await stream.recv()
    assert (update.type_url, sent(update), list(update.removed_resources)) == (ENDPOINT, ["b"], [])
    stream.send(delta_request(ENDPOINT, nonce=update.nonce))
    await stream.silent()
    await stream.close()


async def test_removal_waits_for_routes_and_is_sent_as_removed_resources(
    harness: Harness,
) -> None:
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    await sync(stream, ["a", "b"])
    harness.cache.set_snapshot("edge", mesh("2", {"a": [1]}, [("/", "a")]))
    rds = await stream.recv()
    assert rds.type_url == ROUTE
    await stream.silent()
    stream.send(delta_request(ROUTE, nonce=rds.nonce))
    cds = await stream.recv()
    assert (cds.type_url, sent(cds), list(cds.removed_resources)) == (CLUSTER, [], ["b"])
    stream.send(delta_request(CLUSTER, nonce=cds.nonce))
    stream.send(delta_request(ENDPOINT, unsubscribe=["b"]))
    await stream.silent()
    await stream.close()


async def test_nack_is_counted_and_not_resent(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    await sync(stream, ["a", "b"])
    harness.cache.set_snapshot("edge", mesh("2", {"a": [1], "b": [2], "c": [3]}, [("/", "a")]))
    cds = await stream.recv()
    assert sent(cds) == ["c"]
    stream.send(delta_request(CLUSTER, nonce=cds.nonce, error="cluster c: bad"))
    await stream.silent(0.1)
    assert harness.metric("tokenweir_xds_nacks_total", type="cds") == 1
    stream.send(delta_request(ENDPOINT, ["c"]))  # an unrelated request does not resend it
    await stream.silent()
    harness.cache.set_snapshot("edge", mesh("3", {"a": [1], "b": [2]}, [("/", "a")]))
    rds = await stream.recv()  # without "c", the next snapshot goes through (routes first)
    assert rds.type_url == ROUTE
    await stream.close()


async def test_stale_nonce_is_ignored(harness: Harness) -> None:
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    first = await sync(stream, ["a", "b"])
    harness.cache.set_snapshot("edge", mesh("2", {"a": [5], "b": [2]}, [("/b", "b"), ("/", "a")]))
    update = await stream.recv()
    stream.send(delta_request(ENDPOINT, nonce=first[ENDPOINT].nonce, error="old news"))
    await stream.silent()
    assert harness.metric("tokenweir_xds_stale_nonces_total", type="eds") == 1
    assert harness.metric("tokenweir_xds_nacks_total", type="eds") == 0
    stream.send(delta_request(ENDPOINT, nonce=update.nonce))
    await stream.silent()
    assert harness.metric("tokenweir_xds_acks_total", type="eds") == 2
    await stream.close()


async def test_reconnect_sends_only_what_envoy_lacks(harness: Harness) -> None:
    """After a control-plane restart Envoy reports what it holds; equal content is not resent."""
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    held = dict(TWO.versions[CLUSTER])
    held["b"] = "something-older"
    held["gone"] = "x"
    stream.send(delta_request(CLUSTER, who=node(), initial=held))
    cds = await stream.recv()
    assert (sent(cds), list(cds.removed_resources)) == (["b"], ["gone"])
    await stream.close()


async def test_rebuilt_cluster_gets_its_endpoints_without_asking(harness: Harness) -> None:
    """Envoy rebuilds a changed EDS cluster and waits for endpoints it never re-requests."""
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    await sync(stream, ["a", "b"])
    changed = r.eds_cluster("a", connect_timeout_ms=900)
    harness.cache.set_snapshot(
        "edge",
        r.snapshot(
            "2",
            changed,
            r.cla("a", [1]),
            r.eds_cluster("b"),
            r.cla("b", [2]),
            r.listener("in", 10000, "rt"),
            r.route_config("rt", [("/b", "b"), ("/", "a")]),
        ),
    )
    cds = await stream.recv()
    eds = await stream.recv()  # no request from Envoy in between
    assert (cds.type_url, sent(cds)) == (CLUSTER, ["a"])
    assert (eds.type_url, sent(eds)) == (ENDPOINT, ["a"])
    await stream.close()


async def test_rejected_clusters_hold_back_endpoint_changes(harness: Harness) -> None:
    """While new clusters are unconfirmed, existing clusters keep the endpoints Envoy has."""
    harness.cache.set_snapshot("edge", TWO)
    stream = harness.stream()
    got = await sync(stream, ["a", "b"])
    moved = mesh("2", {"a": [9], "b": [2], "c": [3]}, [("/b", "b"), ("/", "a")])
    harness.cache.set_snapshot("edge", moved)
    cds = await stream.recv()
    assert sent(cds) == ["c"]
    await stream.silent()  # a's new endpoints wait for the CDS verdict
    stream.send(delta_request(CLUSTER, nonce=cds.nonce, error="no c"))
    await stream.silent()  # rejected: Envoy stays wholly on version 1
    assert got[ENDPOINT].system_version_info == "1"
    await stream.close()
