from __future__ import annotations

import pytest
from envoy.config.core.v3 import grpc_service_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from google.protobuf import any_pb2

from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.snapshot import Snapshot, resource_version
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.controlplane.xds import resources as r


def consistent() -> Snapshot:
    return r.snapshot(
        "1",
        r.eds_cluster("pool"),
        r.cla("pool", [8001, 8002]),
        r.eds_cluster("proc"),
        r.cla("proc", [9001]),
        r.listener("in", 10000, "rt", ext_proc_cluster="proc"),
        r.route_config("rt", [("/v1", "pool")]),
    )


def test_consistent_snapshot_passes_check() -> None:
    snap = consistent()
    snap.check()
    assert set(snap.of_type(CLUSTER)) == {"pool", "proc"}
    assert set(snap.of_type(ENDPOINT)) == {"pool", "proc"}


def test_check_lists_every_dangling_reference() -> None:
    snap = r.snapshot(
        "7",
        r.eds_cluster("pool"),  # no ClusterLoadAssignment
        r.listener("in", 10000, "missing-routes", ext_proc_cluster="no-proc"),
        r.route_config("rt", [("/v1", "ghost")], weighted=[("pool", 1), ("ghost-w", 3)]),
    )
    with pytest.raises(InconsistentSnapshotError) as caught:
        snap.check()
    problems = "\n".join(caught.value.problems)
    assert len(caught.value.problems) == 5, problems
    assert "cds 'pool': EDS cluster needs ClusterLoadAssignment 'pool'" in problems
    assert "route configuration 'missing-routes'" in problems
    assert "envoy_grpc.cluster_name names cluster 'no-proc'" in problems
    assert "route.cluster names cluster 'ghost'" in problems
    assert "weighted_clusters.clusters[1].name names cluster 'ghost-w'" in problems
    assert caught.value.version == "7"


def test_ratelimit_service_cluster_must_exist_unless_static() -> None:
    ratelimit = rate_limit_pb2.RateLimit(domain="tokenweir")
    ratelimit.rate_limit_service.grpc_service.CopyFrom(
        grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name="rls")
        )
    )
    listener = r.listener("in", 10000, "rt")
    manager_any = listener.filter_chains[0].filters[0].typed_config
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    manager = hcm_pb2.HttpConnectionManager()
    manager_any.Unpack(manager)
    packed = any_pb2.Any()
    packed.Pack(ratelimit)
    manager.http_filters.insert(0, hcm_pb2.HttpFilter(name="rl", typed_config=packed))
    manager_any.Pack(manager)
    snap = r.snapshot(
        "1", r.eds_cluster("a"), r.cla("a", [1]), listener, r.route_config("rt", [("/", "a")])
    )
    assert [p for p in snap.problems() if "'rls'" in p]
    assert snap.problems(known_clusters={"rls"}) == []


def test_misfiled_resource_is_reported() -> None:
    cluster = r.eds_cluster("a")
    snap = Snapshot("1", {CLUSTER: {"b": cluster}, ENDPOINT: {"b": r.cla("b", [1])}})
    assert any("cds 'b': holds Cluster 'a'" in p for p in snap.problems())
    wrong_type = Snapshot("1", {LISTENER: {"a": cluster}})
    assert any("holds Cluster" in p for p in wrong_type.problems())


def test_resource_versions_are_stable_and_follow_content() -> None:
    assert resource_version(r.cla("a", [1, 2])) == resource_version(r.cla("a", [1, 2]))
    assert resource_version(r.cla("a", [1, 2])) != resource_version(r.cla("a", [1, 3]))
    one, two = consistent(), consistent()
    assert one.versions == two.versions
    assert one.versions[ROUTE]["rt"] == resource_version(r.route_config("rt", [("/v1", "pool")]))


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate cds resource 'a'"):
        Snapshot.of("1", [r.eds_cluster("a"), r.eds_cluster("a")])


def test_packed_resources_are_reused() -> None:
    snap = consistent()
    assert snap.packed(CLUSTER, "pool") is snap.packed(CLUSTER, "pool")
    assert snap.packed(CLUSTER, "pool").type_url == CLUSTER
