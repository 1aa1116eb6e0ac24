"""ClusterLoadAssignments: the endpoints of every pool and service (EDS)."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from controlplane.translate.protos import socket_address
from policy.model import Address

__all__ = ["load_assignment"]


def load_assignment(
    cluster: str, endpoints: tuple[Address, ...]
) -> endpoint_pb2.ClusterLoadAssignment:
    lb = [
        endpoint_components_pb2.LbEndpoint(
            endpoint=endpoint_components_pb2.Endpoint(address=socket_address(ep.host, ep.port))
        )
        for ep in sorted(endpoints)
    ]
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster,
        endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=lb)] if lb else [],
    )
