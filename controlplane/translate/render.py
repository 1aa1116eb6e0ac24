"""policy → Envoy resources per node group (gateway name or sidecar name). Pure.

Every node group gets only what its role uses: the clusters its routes name (plus the
rate-limit / filter server clusters when its routes use them), their endpoints, its listeners
and route configurations.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from controlplane.translate import clusters, names
from controlplane.translate.dns import is_dns, resolve_by_dns
from controlplane.translate.endpoints import load_assignment
from controlplane.translate.listeners import gateway_listener, route_hooks, sidecar_listener
from controlplane.translate.routes import (
    gateway_routes,
    sidecar_inbound_routes,
    sidecar_outbound_routes,
)
from controlplane.translate.tls import upstream_transport_socket
from controlplane.translate.tracing import hcm_tracing
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from policy.model import Policy
from policy.phases import uses_collapse, uses_shadow_pairs
from policy.servers import replica_addresses
from wire.jsontypes import JsonObject

__all__ = ["CLUSTER", "ENDPOINT", "LISTENER", "ROUTE", "Resources", "render"]


# type URL → resource name → resource
Resources = dict[str, dict[str, Message]]


def render(policy: Policy) -> dict[str, Resources]:
    """The resources of every node group in ``policy``, keyed by group (node cluster) name."""
    out: dict[str, Resources] = {}
    for node, gw in policy.gateways.items():
        res = _empty()
        hooks, per_route = route_hooks(policy, gw.routes)
        listener = gateway_listener(node, gw, hooks, _tracing(policy, node, res))
        if policy.replicas.gateway > 1:  # the replicas share the port; the kernel spreads clients
            listener.enable_reuse_port.value = True
        _add(res, LISTENER, listener)
        _add(res, ROUTE, gateway_routes(policy, node, gw, per_route))
        for route in gw.routes:
            if route.pool is not None:
                _pool(policy, res, route.pool)
                if route.shadow is not None:
                    _pool(policy, res, route.shadow.pool)
            elif route.service is not None:
                _service(policy, res, route.service)
        _servers(policy, res, hooks_used={f.name for f in hooks})
        if any(uses_collapse(r) for r in gw.routes):
            _add(res, CLUSTER, clusters.collapse_cluster())
        if any(uses_shadow_pairs(r) for r in gw.routes):
            _add(res, CLUSTER, clusters.shadow_cluster())
        out[node] = res
    for node, sc in policy.sidecars.items():
        res = _empty()
        if sc.inbound is not None:
            _add(
                res,
                CLUSTER,
                clusters.static_cluster(names.local_cluster(node), sc.inbound.local, http2=False),
            )
            tracing = _tracing(policy, node, res)
            _add(
                res,
                LISTENER,
                sidecar_listener(node, "inbound", sc.inbound.listen, sc.downstream, tracing),
            )
            _add(res, ROUTE, sidecar_inbound_routes(node, sc))
        if sc.outbound is not None:
            tracing = _tracing(policy, node, res)
            _add(
                res,
                LISTENER,
                sidecar_listener(node, "outbound", sc.outbound.listen, sc.downstream, tracing),
            )
            _add(res, ROUTE, sidecar_outbound_routes(policy, node, sc))
            for up in sc.outbound.upstreams:
                if up in policy.services:
                    _service(policy, res, up)
                else:
                    _pool(policy, res, up)
        out[node] = res
    return out


def _tracing(policy: Policy, node: str, res: Resources):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    """The HCM tracing of ``node``'s listeners (and its collector cluster), or None."""
    if policy.tracing is None:
        return None
    _add(
        res,
        CLUSTER,
        clusters.static_cluster(names.TRACING_CLUSTER, policy.tracing.collector, http2=True),
    )
    return hcm_tracing(policy.tracing, node)


def _empty() -> Resources:
    return {CLUSTER: {}, ENDPOINT: {}, LISTENER: {}, ROUTE: {}}


def _add(res: Resources, type_url: str, msg: Message) -> None:
    name = msg.cluster_name if type_url == ENDPOINT else msg.name  # type: ignore[attr-defined]  # every resource but ClusterLoadAssignment has name; Message declares no fields
    res[type_url][name] = msg


def _pool(policy: Policy, res: Resources, name: str) -> None:
    pool = policy.pools[name]
    if names.pool_cluster(name) in res[CLUSTER]:
        return
    if is_dns(pool.endpoints):  # Kubernetes: Envoy resolves the replicas' names itself
        _add(res, CLUSTER, resolve_by_dns(clusters.pool_cluster(name, pool), pool.endpoints))
    else:
        _add(res, CLUSTER, clusters.pool_cluster(name, pool))
        _add(res, ENDPOINT, load_assignment(names.pool_cluster(name), pool.endpoints))
    if pool.canary is not None:
        _add(res, CLUSTER, clusters.canary_cluster(name, pool))
        _add(res, ENDPOINT, load_assignment(names.canary_cluster(name), pool.canary.endpoints))
    if pool.fallback is not None:
        _pool(policy, res, pool.fallback)
        _add(res, CLUSTER, clusters.fallback_cluster(name, pool.fallback))


def _service(policy: Policy, res: Resources, name: str) -> None:
    svc = policy.services[name]
    if is_dns(svc.endpoints):
        _add(res, CLUSTER, resolve_by_dns(clusters.service_cluster(name, svc), svc.endpoints))
    else:
        _add(res, CLUSTER, clusters.service_cluster(name, svc))
        _add(res, ENDPOINT, load_assignment(names.service_cluster(name), svc.endpoints))


def _servers(policy: Policy, res: Resources, hooks_used: set[str]) -> None:
    if policy.filters is not None and "envoy.filters.http.ext_proc" in hooks_used:
        f = policy.filters
        cluster = clusters.static_cluster(
            names.FILTERS_CLUSTER,
            replica_addresses(f.address, policy.replicas.filters),
            http2=True,
            processes=f.processes,
        )
        if f.tls is not None:  # mTLS with the filter server (policy.service_tls)
            cluster.transport_socket.CopyFrom(upstream_transport_socket(f.tls.upstream()))
        _add(res, CLUSTER, cluster)
    if policy.ratelimit is not None and "envoy.filters.http.ratelimit" in hooks_used:
        rl = policy.ratelimit
        cluster = clusters.static_cluster(
            names.RATELIMIT_CLUSTER,
            replica_addresses(rl.address, policy.replicas.ratelimit),
            http2=True,
            processes=rl.replicas,
        )
        if rl.tls is not None:  # mTLS with the rate-limit service
            cluster.transport_socket.CopyFrom(upstream_transport_socket(rl.tls.upstream()))
        _add(res, CLUSTER, cluster)


def to_json(groups: Mapping[str, Resources]) -> dict[str, dict[str, dict[str, JsonObject]]]:
    """group → resource kind (``Cluster``, …) → name → the resource as JSON (for review/diffs)."""
    return {
        group: {
            type_url.rsplit(".", 1)[-1]: {
                name: MessageToDict(msg) for name, msg in sorted(by_name.items())
            }
            for type_url, by_name in res.items()
        }
        for group, res in sorted(groups.items())
    }
