"""Envoy resource names derived from policy names, in one place."""

from __future__ import annotations

from policy.phases import SHADOW_CLUSTER  # mirrors to a shadow recorder

__all__ = [
    "COLLAPSE_CLUSTER",
    "FILTERS_CLUSTER",
    "RATELIMIT_CLUSTER",
    "SHADOW_CLUSTER",
    "TRACING_CLUSTER",
    "fallback_cluster",
    "listener_name",
    "local_cluster",
    "pool_cluster",
    "route_config_name",
    "service_cluster",
]

RATELIMIT_CLUSTER = "tokenweir_ratelimit"
FILTERS_CLUSTER = "tokenweir_filters"
COLLAPSE_CLUSTER = "tokenweir_collapse"  # followers of a collapsed request (ORIGINAL_DST)
TRACING_CLUSTER = "tokenweir_otel_collector"


def pool_cluster(pool: str) -> str:
    return f"pool_{pool}"


def canary_cluster(pool: str) -> str:
    """The canary replicas of a pool (policy ``pools.NAME.canary``)."""
    return f"pool_{pool}_canary"


def fallback_cluster(pool: str) -> str:
    """Aggregate cluster: the pool first, its fallback pool when the pool has no healthy host."""
    return f"pool_{pool}_with_fallback"


def service_cluster(service: str) -> str:
    return f"svc_{service}"


def local_cluster(sidecar: str) -> str:
    return f"local_{sidecar}"


def listener_name(node: str, kind: str) -> str:
    return f"{node}_{kind}"


def route_config_name(node: str, kind: str) -> str:
    return f"{node}_{kind}_routes"
