"""Endpoints named by DNS (Kubernetes Services) instead of IP literals. Pure.

Envoy resolves them itself (``STRICT_DNS``: every A record is a host, re-resolved every few
seconds), so no discovery code of ours runs: an EDS resource can only carry IP addresses.
A ring-hash pool hashes by *hostname* (``use_hostname_for_hashing``), so the ring is the same
in every gateway replica and survives a pod restarted under a new IP; a pool should therefore
name its replicas one by one (a StatefulSet's stable names ``sglang-0.sglang:30000``, ...),
never through one name that resolves to many (docs/deploy.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from controlplane.translate.protos import dur, socket_address
from policy.model import Address

__all__ = ["DNS_REFRESH_S", "is_dns", "resolve_by_dns"]

DNS_REFRESH_S = 5.0


def is_dns(endpoints: Sequence[Address]) -> bool:
    """True when any endpoint is a name rather than an IP literal."""
    for ep in endpoints:
        try:
            ipaddress.ip_address(ep.host)
        except ValueError:
            return True
    return False


def resolve_by_dns(c: cluster_pb2.Cluster, endpoints: Sequence[Address]) -> cluster_pb2.Cluster:
    """``c`` turned into a STRICT_DNS cluster whose hosts are ``endpoints`` (in place)."""
    c.ClearField("eds_cluster_config")
    c.type = cluster_pb2.Cluster.STRICT_DNS
    c.dns_lookup_family = cluster_pb2.Cluster.V4_PREFERRED
    c.dns_refresh_rate.CopyFrom(dur(DNS_REFRESH_S))
    c.respect_dns_ttl = True
    c.load_assignment.CopyFrom(
        endpoint_pb2.ClusterLoadAssignment(
            cluster_name=c.name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=socket_address(ep.host, ep.port), hostname=ep.host
                            )
                        )
                        for ep in sorted(endpoints)
                    ]
                )
            ],
        )
    )
    if c.lb_policy == cluster_pb2.Cluster.RING_HASH:
        c.common_lb_config.consistent_hashing_lb_config.use_hostname_for_hashing = True
    return c
