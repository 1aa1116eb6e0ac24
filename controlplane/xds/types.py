"""The xDS v3 resource type URLs served over ADS, in make-before-break order."""

from __future__ import annotations

__all__ = ["CLUSTER", "ENDPOINT", "LISTENER", "ORDER", "ROUTE", "WILDCARD_TYPES", "short_name"]

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"

# Envoy asks CDS, then EDS, then LDS, then RDS; pushes follow the same order so that
# clusters and endpoints exist before the listeners and routes that use them.
ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE)

# CDS and LDS are fetched as "everything for this node"; EDS and RDS by resource name.
WILDCARD_TYPES = frozenset({CLUSTER, LISTENER})

_SHORT = {CLUSTER: "cds", ENDPOINT: "eds", LISTENER: "lds", ROUTE: "rds"}


def short_name(type_url: str) -> str:
    """``cds``/``eds``/``lds``/``rds`` for the four known types, else the message name."""
    return _SHORT.get(type_url, type_url.rsplit(".", 1)[-1])
