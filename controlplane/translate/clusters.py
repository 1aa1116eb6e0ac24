"""Clusters: one per LLM pool (ring hash, bounded load, outlier ejection, health checks,
per-priority circuit breakers), one per ordinary service, the sidecars' local app clusters,
and the gRPC clusters of the rate-limit and filter servers."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2, health_check_pb2, protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2 as hpo
from envoy.type.v3 import percent_pb2
from google.protobuf.message import Message

from controlplane.translate import names
from controlplane.translate.dns import is_dns, resolve_by_dns
from controlplane.translate.protos import ads_source, any_of, dur, socket_address, u32
from controlplane.translate.tls import upstream_transport_socket
from policy.model import (
    Address,
    CircuitBreakers,
    HealthCheck,
    HttpService,
    LlmPool,
    OutlierDetection,
    Retries,
    Thresholds,
)
from policy.phases import COLLAPSE_TO_HEADER, SHADOW_TO_HEADER
from policy.routing import ENDPOINT_HEADER

__all__ = [
    "fallback_cluster",
    "override_host_policy",
    "pool_cluster",
    "service_cluster",
    "static_cluster",
]

_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def pool_cluster(name: str, pool: LlmPool) -> cluster_pb2.Cluster:
    c = _eds_cluster(names.pool_cluster(name), pool.timeouts.connect)
    c.circuit_breakers.CopyFrom(_lane_breakers(pool.circuit_breakers, pool.retries))
    _outliers(c, pool.outlier_detection)
    _health(c, pool.health_check)
    _http1(c, idle=pool.timeouts.stream_idle)
    if pool.tls is not None:  # replicas on other hosts (controlplane.translate.tls)
        c.transport_socket.CopyFrom(upstream_transport_socket(pool.tls))
    # the filter server names the replica: the picker, a ranked pool's lane balance, PD's pairs,
    # a LoRA pool's adapter affinity (filters/plugins/lora)
    named = pool.routing.mode == "prefix_index" or pool.balances_lanes or pool.disaggregation
    if named or pool.lora is not None:
        c.load_balancing_policy.CopyFrom(override_host_policy(pool))
        return c
    c.lb_policy = cluster_pb2.Cluster.RING_HASH
    c.ring_hash_lb_config.CopyFrom(
        cluster_pb2.Cluster.RingHashLbConfig(
            minimum_ring_size=_u64(pool.affinity.minimum_ring_size),
            maximum_ring_size=_u64(pool.affinity.maximum_ring_size),
            hash_function=cluster_pb2.Cluster.RingHashLbConfig.XX_HASH,
        )
    )
    if pool.affinity.hash_balance_factor is not None:
        c.common_lb_config.consistent_hashing_lb_config.hash_balance_factor.value = (
            pool.affinity.hash_balance_factor
        )
    return c


def override_host_policy(pool: LlmPool) -> cluster_pb2.LoadBalancingPolicy:
    """The host named in ``x-tokenweir-endpoint`` (set by the filter server: the endpoint
    picker, or admission's lane balance of a ranked pool) when it is in the cluster and healthy,
    else ring hash on the route's hash policy (session / prefix headers) with the pool's bounded
    load."""
    aff = pool.affinity
    ring = ring_hash_pb2.RingHash(
        hash_function=ring_hash_pb2.RingHash.XX_HASH,
        minimum_ring_size=_u64(aff.minimum_ring_size),
        maximum_ring_size=_u64(aff.maximum_ring_size),
    )
    if aff.hash_balance_factor is not None:
        ring.consistent_hashing_lb_config.hash_balance_factor.value = aff.hash_balance_factor
    override = override_host_pb2.OverrideHost(
        override_host_sources=[
            override_host_pb2.OverrideHost.OverrideHostSource(header=ENDPOINT_HEADER)
        ],
        fallback_policy=_lb_policy("envoy.load_balancing_policies.ring_hash", ring),
    )
    return _lb_policy("envoy.load_balancing_policies.override_host", override)


def _lb_policy(name: str, msg: Message) -> cluster_pb2.LoadBalancingPolicy:
    return cluster_pb2.LoadBalancingPolicy(
        policies=[
            cluster_pb2.LoadBalancingPolicy.Policy(
                typed_extension_config=extension_pb2.TypedExtensionConfig(
                    name=name, typed_config=any_of(msg)
                )
            )
        ]
    )


def service_cluster(name: str, svc: HttpService) -> cluster_pb2.Cluster:
    c = _eds_cluster(names.service_cluster(name), svc.timeouts.connect)
    c.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    c.circuit_breakers.CopyFrom(
        circuit_breaker_pb2.CircuitBreakers(
            thresholds=[_thresholds(base_pb2.DEFAULT, svc.circuit_breakers, svc.retries)]
        )
    )
    if svc.outlier_detection is not None:
        _outliers(c, svc.outlier_detection)
    if svc.health_check is not None:
        _health(c, svc.health_check)
    _http1(c, idle=svc.timeouts.stream_idle)
    if svc.tls is not None:
        c.transport_socket.CopyFrom(upstream_transport_socket(svc.tls))
    return c


def static_cluster(
    name: str,
    address: Address | Sequence[Address],
    *,
    http2: bool,
    connect_timeout: float = 1.0,
    processes: int = 1,
) -> cluster_pb2.Cluster:
    """A cluster of fixed addresses (local app, rate-limit servers, filter servers).

    ``processes`` > 1: the server runs several processes on one port (SO_REUSEPORT spreads
    *connections*), so Envoy is made to open several HTTP/2 connections by capping the streams
    per connection; with one connection only one process would get work.

    Several addresses (server replicas, ``replicas:`` in the policy): each is a host of its own,
    gRPC health-checked every second and ejected after two failed calls, so a dead replica
    costs the calls in flight on it and about a second of retries, not an outage. A DNS name
    (a Kubernetes Service) is resolved by Envoy (STRICT_DNS, every A record a host).
    """
    addresses = (address,) if isinstance(address, Address) else tuple(address)
    c = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=dur(connect_timeout),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=socket_address(a.host, a.port)
                            )
                        )
                        for a in addresses
                    ]
                )
            ],
        ),
    )
    if is_dns(addresses):
        resolve_by_dns(c, addresses)
    if http2:
        opts = hpo.HttpProtocolOptions(
            explicit_http_config=hpo.HttpProtocolOptions.ExplicitHttpConfig(
                http2_protocol_options=protocol_pb2.Http2ProtocolOptions(
                    connection_keepalive=protocol_pb2.KeepaliveSettings(
                        interval=dur(30), timeout=dur(5)
                    ),
                    max_concurrent_streams=u32(16) if processes > 1 else None,
                )
            )
        )
        c.typed_extension_protocol_options[_HTTP_OPTIONS].CopyFrom(any_of(opts))
        if len(addresses) > 1 or is_dns(addresses):
            _replica_guard(c)
    else:
        _http1(c, idle=300.0)
    return c


def _replica_guard(c: cluster_pb2.Cluster) -> None:
    """gRPC health checks and fast ejection for a cluster of several server replicas."""
    c.health_checks.append(
        health_check_pb2.HealthCheck(
            timeout=dur(1.0),
            interval=dur(1.0),
            no_traffic_interval=dur(1.0),
            unhealthy_threshold=u32(1),
            healthy_threshold=u32(1),
            grpc_health_check=health_check_pb2.HealthCheck.GrpcHealthCheck(),
        )
    )
    c.outlier_detection.CopyFrom(
        outlier_detection_pb2.OutlierDetection(
            consecutive_5xx=u32(2),
            consecutive_gateway_failure=u32(2),
            enforcing_consecutive_gateway_failure=u32(100),
            consecutive_local_origin_failure=u32(2),
            enforcing_consecutive_local_origin_failure=u32(100),
            interval=dur(1.0),
            base_ejection_time=dur(5.0),
            max_ejection_percent=u32(50),
            enforcing_success_rate=u32(0),
        )
    )


def fallback_cluster(pool: str, fallback: str) -> cluster_pb2.Cluster:
    """Aggregate cluster: every request goes to ``pool`` while it has healthy hosts, else ``fallback``."""
    cfg = aggregate_pb2.ClusterConfig(
        clusters=[names.pool_cluster(pool), names.pool_cluster(fallback)]
    )
    return cluster_pb2.Cluster(
        name=names.fallback_cluster(pool),
        connect_timeout=dur(1.0),
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        cluster_type=cluster_pb2.Cluster.CustomClusterType(
            name="envoy.clusters.aggregate", typed_config=any_of(cfg)
        ),
    )


def canary_cluster(name: str, pool: LlmPool) -> cluster_pb2.Cluster:
    """The pool's canary replicas: the pool's cluster settings under the canary's name."""
    c = pool_cluster(name, pool)
    c.name = names.canary_cluster(name)
    return c


def collapse_cluster() -> cluster_pb2.Cluster:
    """Followers of a collapsed request: ORIGINAL_DST on the header the collapse plugin sets to
    its own fan-out endpoint (host:port of the filter process that holds the leader)."""
    c = cluster_pb2.Cluster(
        name=names.COLLAPSE_CLUSTER,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        connect_timeout=dur(1.0),
        original_dst_lb_config=cluster_pb2.Cluster.OriginalDstLbConfig(
            use_http_header=True, http_header_name=COLLAPSE_TO_HEADER
        ),
    )
    _http1(c, idle=60.0)
    return c


def shadow_cluster() -> cluster_pb2.Cluster:
    """Mirrors sampled by the shadow plugin: ORIGINAL_DST on the header it sets to its own
    shadow recorder (host:port of the filter process that holds the primary's side)."""
    c = cluster_pb2.Cluster(
        name=names.SHADOW_CLUSTER,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        connect_timeout=dur(1.0),
        original_dst_lb_config=cluster_pb2.Cluster.OriginalDstLbConfig(
            use_http_header=True, http_header_name=SHADOW_TO_HEADER
        ),
    )
    _http1(c, idle=60.0)
    return c


# -- pieces -----------------------------------------------------------------------------------
def _eds_cluster(name: str, connect_timeout: float) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads_source()),
        connect_timeout=dur(connect_timeout),
        ignore_health_on_host_removal=True,
    )


def _lane_breakers(cb: CircuitBreakers, retries: Retries) -> circuit_breaker_pb2.CircuitBreakers:
    """interactive → HIGH, batch → DEFAULT: batch overflow is cut first, interactive keeps room."""
    return circuit_breaker_pb2.CircuitBreakers(
        thresholds=[
            _thresholds(base_pb2.DEFAULT, cb.batch, retries),
            _thresholds(base_pb2.HIGH, cb.interactive, retries),
        ]
    )


def _thresholds(
    priority: int, t: Thresholds, retries: Retries
) -> circuit_breaker_pb2.CircuitBreakers.Thresholds:
    th = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        priority=priority,  # type: ignore[arg-type]  # an int is a valid RoutingPriority enum value; the stub wants the enum type
        max_connections=u32(t.max_connections),
        max_pending_requests=u32(t.max_pending_requests),
        max_requests=u32(t.max_requests),
        max_retries=u32(t.max_retries),
        track_remaining=True,
    )
    if retries.enabled and retries.budget_percent is not None:
        # Envoy ignores max_retries once a retry budget is set: the budget scales with load.
        th.retry_budget.CopyFrom(
            circuit_breaker_pb2.CircuitBreakers.Thresholds.RetryBudget(
                budget_percent=percent_pb2.Percent(value=retries.budget_percent),
                min_retry_concurrency=u32(retries.budget_min_concurrency),
            )
        )
    return th


def _outliers(c: cluster_pb2.Cluster, od: OutlierDetection) -> None:
    if not od.enabled:
        return
    c.outlier_detection.CopyFrom(
        outlier_detection_pb2.OutlierDetection(
            consecutive_5xx=u32(od.consecutive_5xx),
            consecutive_gateway_failure=u32(od.consecutive_gateway_errors),
            enforcing_consecutive_5xx=u32(100),
            enforcing_consecutive_gateway_failure=u32(100),
            interval=dur(od.interval),
            base_ejection_time=dur(od.base_ejection_time),
            max_ejection_percent=u32(round(od.max_ejection_percent)),
            enforcing_success_rate=u32(0),
        )
    )


def _health(c: cluster_pb2.Cluster, hc: HealthCheck) -> None:
    if not hc.enabled:
        return
    c.health_checks.append(
        health_check_pb2.HealthCheck(
            timeout=dur(hc.timeout),
            interval=dur(hc.interval),
            no_traffic_interval=dur(
                hc.interval
            ),  # Envoy's default (60 s) would hide a dead idle replica
            unhealthy_threshold=u32(hc.unhealthy_threshold),
            healthy_threshold=u32(hc.healthy_threshold),
            http_health_check=health_check_pb2.HealthCheck.HttpHealthCheck(path=hc.path),
        )
    )
    c.common_lb_config.healthy_panic_threshold.value = 0.0  # never spray traffic at unhealthy hosts


def _http1(c: cluster_pb2.Cluster, *, idle: float) -> None:
    opts = hpo.HttpProtocolOptions(
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(
            idle_timeout=dur(idle) if idle > 0 else None
        ),
        explicit_http_config=hpo.HttpProtocolOptions.ExplicitHttpConfig(
            http_protocol_options=protocol_pb2.Http1ProtocolOptions()
        ),
    )
    c.typed_extension_protocol_options[_HTTP_OPTIONS].CopyFrom(any_of(opts))


def _u64(v: int):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from google.protobuf import wrappers_pb2

    return wrappers_pb2.UInt64Value(value=v)
