"""The ratelimit HTTP filter (rate-limit service, ratelimit_service/) and its per-route config. Pure.

Token costs travel in the filter's **own** ``rate_limits`` (Envoy honours ``hits_addend`` and
``apply_on_stream_done`` only there; DESIGN.md fact 1), one descriptor per entry:

* request time: tenant, model, lane, request_id, ``phase=reserve``; cost ``%REQ(x-tokenweir-reserve)%``
* a route that takes the batch runner's lines adds ``route=<name>`` to both (a per-route
  override): the rate-limit service prices its reservation at ``batch.price_factor``
* stream done: the same with ``phase=settle``; cost ``%DYNAMIC_METADATA(tokenweir:settle_tokens)%``
  (the filter server sets it to 0 with the request headers and the usage plugin raises it as
  output passes, so it is always there: without it Envoy would log "Invalid hits_addend", make no
  call, and the whole reservation would stay charged until it expires)

The request headers exist only on LLM routes (the filter server sets them), so these descriptors
are produced nowhere else. A route to an ordinary service with ``rate_limit`` enabled counts
requests per (service, client address) through a per-route ``rate_limits`` override (cost 1).
A route without rate limiting has the filter disabled.
"""

from __future__ import annotations

from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2
from envoy.config.ratelimit.v3 import rls_pb2 as rls_config_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.metadata.v3 import metadata_pb2

from controlplane.translate.names import RATELIMIT_CLUSTER
from controlplane.translate.protos import Packed, any_of, dur
from policy.model import Policy, RateLimitServer, Route
from wire.contract import (
    DESCRIPTOR_HEADERS,
    KEY_PHASE,
    KEY_ROUTE,
    KEY_SERVICE,
    KEY_USD,
    METADATA_NAMESPACE,
    PHASE_REQUESTS,
    PHASE_RESERVE,
    PHASE_SETTLE,
    RESERVE_HEADER,
    SETTLE_KEY,
    SETTLE_USD_KEY,
)

__all__ = [
    "RATELIMIT_FILTER",
    "RESERVE_FORMAT",
    "SETTLE_FORMAT",
    "llm_rate_limits",
    "ratelimit_http_filter",
    "ratelimit_per_route",
    "service_rate_limits",
]

RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
RESERVE_FORMAT = f"%REQ({RESERVE_HEADER})%"
SETTLE_FORMAT = f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{SETTLE_KEY})%"
_A = rc.RateLimit.Action


def _phase(value: str) -> rc.RateLimit.Action:
    return _A(generic_key=_A.GenericKey(descriptor_key=KEY_PHASE, descriptor_value=value))


def llm_rate_limits(route: str | None = None) -> list[rc.RateLimit]:
    """The reserve (request time) and settle (stream done) entries; with ``route``, each names
    it (a route that pays a price factor)."""
    actions = [
        _A(request_headers=_A.RequestHeaders(header_name=h, descriptor_key=k))
        for h, k in DESCRIPTOR_HEADERS
    ]
    if route is not None:
        actions.append(
            _A(generic_key=_A.GenericKey(descriptor_key=KEY_ROUTE, descriptor_value=route))
        )
    reserve = rc.RateLimit(
        actions=[*actions, _phase(PHASE_RESERVE)],
        hits_addend=rc.RateLimit.HitsAddend(format=RESERVE_FORMAT),
    )
    usd = _A(
        metadata=_A.MetaData(
            descriptor_key=KEY_USD,
            metadata_key=metadata_pb2.MetadataKey(
                key=METADATA_NAMESPACE,
                path=[metadata_pb2.MetadataKey.PathSegment(key=SETTLE_USD_KEY)],
            ),
            default_value="-",
            source=_A.MetaData.DYNAMIC,
        )
    )
    settle = rc.RateLimit(
        actions=[*actions, usd, _phase(PHASE_SETTLE)],
        hits_addend=rc.RateLimit.HitsAddend(format=SETTLE_FORMAT),
        apply_on_stream_done=True,
    )
    return [reserve, settle]


def service_rate_limits(service: str) -> list[rc.RateLimit]:
    """Request counts of an ordinary service, per client address (cost 1)."""
    return [
        rc.RateLimit(
            actions=[
                _A(generic_key=_A.GenericKey(descriptor_key=KEY_SERVICE, descriptor_value=service)),
                _A(remote_address=_A.RemoteAddress()),
                _phase(PHASE_REQUESTS),
            ]
        )
    ]


def ratelimit_http_filter(policy: Policy) -> hcm_pb2.HttpFilter:
    rl = policy.ratelimit if policy.ratelimit is not None else RateLimitServer()
    cfg = rate_limit_pb2.RateLimit(
        domain=rl.domain,
        request_type="both",
        timeout=dur(rl.timeout),
        failure_mode_deny=rl.failure_mode_deny,
        rate_limited_as_resource_exhausted=False,
        enable_x_ratelimit_headers=rate_limit_pb2.RateLimit.DRAFT_VERSION_03,
        rate_limit_service=rls_config_pb2.RateLimitServiceConfig(
            grpc_service=grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=RATELIMIT_CLUSTER),
                timeout=dur(rl.timeout),
            ),
            transport_api_version=config_source_pb2.V3,
        ),
        rate_limits=llm_rate_limits(),
    )
    return hcm_pb2.HttpFilter(name=RATELIMIT_FILTER, typed_config=any_of(cfg))


def ratelimit_per_route(route: Route, priced: frozenset[str] = frozenset()) -> dict[str, Packed]:
    """typed_per_filter_config entries for one route; ``priced``: the routes whose descriptors
    name them (the batch lines': ``policy.batch_checks.batch_line_routes``)."""
    if route.rate_limit is None or not route.rate_limit.enabled:
        return {RATELIMIT_FILTER: any_of(rc.FilterConfig(disabled=True))}
    if route.service is not None:
        per_route = rate_limit_pb2.RateLimitPerRoute(rate_limits=service_rate_limits(route.service))
        return {RATELIMIT_FILTER: any_of(per_route)}
    named = route.name if route.name in priced else None
    if not route.rate_limit.settle_on_stream_done:
        per_route = rate_limit_pb2.RateLimitPerRoute(rate_limits=llm_rate_limits(named)[:1])
        return {RATELIMIT_FILTER: any_of(per_route)}
    if named is not None:
        per_route = rate_limit_pb2.RateLimitPerRoute(rate_limits=llm_rate_limits(named))
        return {RATELIMIT_FILTER: any_of(per_route)}
    return {}
