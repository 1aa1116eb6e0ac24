"""The xDS view of each connected Envoy (controlplane.xds.status) on the ADS fakes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.metrics import XdsMetrics
from controlplane.xds.server import AdsServicer
from controlplane.xds.status import ADMIN_METADATA, node_status
from controlplane.xds.types import CLUSTER
from tests.controlplane.xds.fakes import FakeStream, ManualClock, sotw_request
from tests.controlplane.xds.test_server_sotw import mesh, sync


async def test_status_shows_acked_versions_and_a_current_nack() -> None:
    cache, clock = SnapshotCache(), ManualClock()
    servicer = AdsServicer(cache, XdsMetrics(CollectorRegistry()), clock=clock)
    cache.set_snapshot("edge", mesh("1", pools={"pool": [8001]}, routes=[("/", "pool")]))
    stream = FakeStream(servicer.StreamAggregatedResources)
    await sync(stream)
    (session,) = servicer.sessions
    ok = node_status(session, clock())
    assert ok["group"] == "edge" and ok["mode"] == "sotw"
    assert ok["admin"] is None  # its node metadata names no admin address
    session.node.metadata.fields[ADMIN_METADATA].string_value = "127.0.0.1:9901"
    assert node_status(session, clock())["admin"] == "127.0.0.1:9901"  # the dashboard reads it
    assert {t: s["acked_version"] for t, s in ok["types"].items()} == {
        "cds": "1", "eds": "1", "lds": "1", "rds": "1",
    }  # fmt: skip
    assert all(s["nack"] is None for s in ok["types"].values())

    cache.set_snapshot("edge", mesh("2", pools={"pool": [8001], "x": [8003]}, routes=[]))
    cds = await stream.recv()
    assert node_status(session, clock())["types"]["cds"]["pending_version"] == "2"
    stream.send(sotw_request(CLUSTER, nonce=cds.nonce, version="1", error="bad cluster x"))
    await stream.silent()
    clock.now += 3.0
    cds_now = node_status(session, clock())["types"]["cds"]
    assert cds_now["acked_version"] == "1" and cds_now["pending_version"] is None
    assert cds_now["nack"] == {
        "version": "2", "error": "bad cluster x", "age_s": 3.0, "current": True,
    }  # fmt: skip
    await stream.close()
    assert servicer.sessions == set()
