"""Small hand-built xDS resources for tests: an EDS cluster, its endpoints, a listener, routes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, config_source_pb2, grpc_service_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message

from controlplane.xds.snapshot import Snapshot

__all__ = ["cla", "eds_cluster", "listener", "route_config", "snapshot"]

LOOPBACK = "127.0.0.1"


def _any(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def eds_cluster(name: str, *, connect_timeout_ms: int = 250) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        connect_timeout=duration_pb2.Duration(nanos=connect_timeout_ms * 1_000_000),
    )
    cluster.eds_cluster_config.eds_config.CopyFrom(_ads())
    return cluster


def cla(
    name: str, ports: Iterable[int], host: str = LOOPBACK
) -> endpoint_pb2.ClusterLoadAssignment:
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    group = assignment.endpoints.add()
    for port in ports:
        group.lb_endpoints.append(
            endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(
                    address=address_pb2.Address(
                        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
                    )
                )
            )
        )
    return assignment


def route_config(
    name: str, routes: Sequence[tuple[str, str]], *, weighted: Sequence[tuple[str, int]] = ()
) -> route_pb2.RouteConfiguration:
    """``routes``: (path prefix, cluster) pairs; ``weighted``: clusters of a final '/' route."""
    config = route_pb2.RouteConfiguration(name=name)
    host = config.virtual_hosts.add(name="all", domains=["*"])
    for prefix, cluster in routes:
        route = host.routes.add()
        route.match.prefix = prefix
        route.route.cluster = cluster
    if weighted:
        route = host.routes.add()
        route.match.prefix = "/"
        for cluster, weight in weighted:
            item = route.route.weighted_clusters.clusters.add(name=cluster)
            item.weight.value = weight
    return config


def listener(
    name: str, port: int, route_name: str, *, ext_proc_cluster: str | None = None
) -> listener_pb2.Listener:
    manager = hcm_pb2.HttpConnectionManager(stat_prefix=name)
    manager.rds.route_config_name = route_name
    manager.rds.config_source.CopyFrom(_ads())
    if ext_proc_cluster is not None:
        processor = ext_proc_pb2.ExternalProcessor(
            grpc_service=grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=ext_proc_cluster)
            )
        )
        manager.http_filters.add(name="envoy.filters.http.ext_proc", typed_config=_any(processor))
    manager.http_filters.add(
        name="envoy.filters.http.router", typed_config=_any(router_pb2.Router())
    )
    result = listener_pb2.Listener(
        name=name,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address=LOOPBACK, port_value=port)
        ),
    )
    result.filter_chains.add().filters.add(
        name="envoy.filters.network.http_connection_manager", typed_config=_any(manager)
    )
    return result


def snapshot(version: str, *resources: Message) -> Snapshot:
    return Snapshot.of(version, resources)
