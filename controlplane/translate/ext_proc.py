"""The ext_proc HTTP filter (filter server, filters/) and its per-route configuration. Pure.

Filter level: every phase skipped (a local reply made before a route is known, such as a
malformed request's 400, must not wait on the filter server). Per route: request headers SEND
(Envoy drops header mutations made with a BUFFERED body otherwise), request body BUFFERED,
response headers SEND, response body STREAMED (SSE chunks pass one by one, never held), trailers
SKIP, each only when a plugin of the route needs it; namespace ``tokenweir`` received as dynamic
metadata (the usage plugin's ``settle_tokens``). Per route: the route's name travels as gRPC
initial metadata ``x-tokenweir-route`` (set here, so clients cannot forge it), the phases its
plugins do not need are skipped, and its failure mode decides ``failure_mode_allow`` (never
open on a metered pool route).
"""

from __future__ import annotations

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2, grpc_service_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import duration_pb2, wrappers_pb2

from controlplane.translate.names import FILTERS_CLUSTER
from controlplane.translate.protos import Packed, any_of, dur
from policy.admission import hold_slack
from policy.model import FiltersServer, Policy, Route
from policy.phases import (
    OVERSIZE_ROUTE_PREFIX,
    ROUTE_HEADER,
    meters_usage,
    route_hooks,
    stops_at_budget,
)
from wire.contract import METADATA_NAMESPACE

__all__ = [
    "EXT_PROC_FILTER",
    "ext_proc_http_filter",
    "ext_proc_oversize_per_route",
    "ext_proc_per_route",
    "route_mode",
]

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
_PM = processing_mode_pb2.ProcessingMode


def _mode(
    request_body: bool, response_headers: bool, response_body: bool, response_end: bool = False
) -> processing_mode_pb2.ProcessingMode:
    """``response_end`` without ``response_body``: no chunk is sent, but the response trailers
    are asked for, which keeps Envoy's ext_proc stream open to the response's end (where the
    filter server's ``stream_end`` runs); Envoy sends a trailers message only when the backend
    sent trailers (policy/phases.py)."""
    return _PM(
        request_header_mode=_PM.SEND,
        request_body_mode=_PM.BUFFERED if request_body else _PM.NONE,
        response_header_mode=_PM.SEND if response_headers else _PM.SKIP,
        response_body_mode=_PM.STREAMED if response_body else _PM.NONE,
        request_trailer_mode=_PM.SKIP,
        response_trailer_mode=_PM.SEND if response_end and not response_body else _PM.SKIP,
    )


def route_mode(route: Route) -> processing_mode_pb2.ProcessingMode:
    """The phases a route's plugins need (request headers always: internal headers are stripped)."""
    names = [p.name for p in route.filters.plugins] if route.filters is not None else []
    if meters_usage(route):  # the Lua usage meter reads the response in Envoy
        names = [n for n in names if n != "usage"]
        hooks = route_hooks(names) | {"request_body"}  # the meter's inputs are set there
    else:
        hooks = route_hooks(names)
    if stops_at_budget(route):  # the usage plugin reads which replica answered
        hooks = hooks | {"response_headers"}
    return _mode(
        "request_body" in hooks,
        "response_headers" in hooks,
        "response_chunk" in hooks,
        "response_end" in hooks,
    )


def ext_proc_http_filter(policy: Policy) -> hcm_pb2.HttpFilter:
    server = policy.filters if policy.filters is not None else FiltersServer()
    cfg = ext_proc_pb2.ExternalProcessor(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=FILTERS_CLUSTER)
        ),
        failure_mode_allow=False,
        # nothing by default: every route with filters sets its own mode (per-route override);
        # a reply Envoy makes before a route is known (a malformed request's 400) must not wait
        # on the filter server, or the connection closes before the 400 is written
        processing_mode=_PM(
            request_header_mode=_PM.SKIP,
            response_header_mode=_PM.SKIP,
            request_trailer_mode=_PM.SKIP,
            response_trailer_mode=_PM.SKIP,
        ),
        message_timeout=dur(server.message_timeout),
        max_message_timeout=_max_message_timeout(policy),
        # admission sets x-envoy-upstream-rq-timeout-ms (a client deadline's remaining budget)
        mutation_rules=(
            mutation_rules_pb2.HeaderMutationRules(allow_envoy=wrappers_pb2.BoolValue(value=True))
            if _uses_admission(policy)
            else None
        ),
        metadata_options=ext_proc_pb2.MetadataOptions(
            receiving_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=[METADATA_NAMESPACE]
            )
        ),
    )
    return hcm_pb2.HttpFilter(name=EXT_PROC_FILTER, typed_config=any_of(cfg))


def _uses_admission(policy: Policy) -> bool:
    return any(
        p.name == "admission"
        for g in policy.gateways.values()
        for r in g.routes
        if r.filters is not None and r.filters.enabled
        for p in r.filters.plugins
    )


def _max_message_timeout(policy: Policy) -> duration_pb2.Duration | None:
    """The longest the filter server may hold one message, plus the answer's slack
    (``hold_slack``): the admission queue's longest lane wait (request headers) and the
    picker's ``routing.coalesce_wait`` (request body); the filter server asks for what it needs
    per request with ``override_message_timeout``. None (unset) when nothing holds."""
    holds = []
    if _uses_admission(policy):
        a = policy.admission
        holds.append(max(a.interactive.wait, a.batch.wait))
    holds += [
        p.routing.coalesce_wait
        for p in policy.pools.values()
        if p.routing.mode == "prefix_index" and p.routing.coalesce_wait > 0
    ]
    if not holds:
        return None
    server = policy.filters if policy.filters is not None else FiltersServer()
    return dur(max(holds) + hold_slack(server.message_timeout))


def _fails_open(route: Route) -> bool:
    """``failure_mode: open``, except on a metered pool route: with the server unreachable nobody
    strips the client's ``x-tokenweir-*`` headers, and the rate-limit descriptors read them (any
    tenant's budget could be spent, or a zero reservation claimed)."""
    assert route.filters is not None
    metered = route.pool is not None and route.rate_limit is not None and route.rate_limit.enabled
    return route.filters.failure_mode == "open" and not metered


def ext_proc_per_route(route: Route) -> dict[str, Packed]:
    """typed_per_filter_config entries: disabled without filters, else mode, route name, failure."""
    if route.filters is None or not route.filters.enabled:
        return {EXT_PROC_FILTER: any_of(ext_proc_pb2.ExtProcPerRoute(disabled=True))}
    overrides = ext_proc_pb2.ExtProcOverrides(
        processing_mode=route_mode(route),
        grpc_initial_metadata=[base_pb2.HeaderValue(key=ROUTE_HEADER, value=route.name)],
        failure_mode_allow=wrappers_pb2.BoolValue(value=_fails_open(route)),
    )
    return {EXT_PROC_FILTER: any_of(ext_proc_pb2.ExtProcPerRoute(overrides=overrides))}


def ext_proc_oversize_per_route(limit: int) -> Packed:
    """A body over ``limit``: streamed to the filter server (full duplex: Envoy buffers nothing
    and keeps reading), which discards it and answers 413 once it has all arrived. Answering
    before would make Envoy close a connection the client is still writing to: a reset instead
    of the answer. Fails open: without the filter server the route's own direct 413 answers."""
    mode = _PM(
        request_header_mode=_PM.SEND,
        request_body_mode=_PM.FULL_DUPLEX_STREAMED,
        request_trailer_mode=_PM.SEND,
        response_header_mode=_PM.SKIP,
        response_trailer_mode=_PM.SKIP,
    )
    overrides = ext_proc_pb2.ExtProcOverrides(
        processing_mode=mode,
        grpc_initial_metadata=[
            base_pb2.HeaderValue(key=ROUTE_HEADER, value=f"{OVERSIZE_ROUTE_PREFIX}{limit}")
        ],
        failure_mode_allow=wrappers_pb2.BoolValue(value=True),
    )
    return any_of(ext_proc_pb2.ExtProcPerRoute(overrides=overrides))
