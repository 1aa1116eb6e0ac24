"""Listeners: one HTTP connection manager per gateway listener and per sidecar direction.

Routes come over RDS (ADS). The HTTP filter chain is the Lua usage meter (``usage_meter``) →
ext_proc (filter server) → ratelimit → router; the first three are present only when some route
of the listener uses them, and are switched off per route through ``typed_per_filter_config`` (an LDS change would not reach open
keep-alive connections; an RDS change does).

Every listener bounds its clients (policy ``downstream``): the request head must arrive within
``request_headers_timeout``, a connection without a request in flight closes after
``idle_timeout``, and a connection-limit network filter closes connections past
``max_connections`` at once (the bootstrap's overload manager caps the whole process).
"""

from __future__ import annotations

import functools
import json

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, protocol_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.connection_limit.v3 import connection_limit_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from controlplane.translate import names
from controlplane.translate.access_log import access_logs
from controlplane.translate.edge import openai_local_replies, strip_internal_headers
from controlplane.translate.protos import ads_source, any_of, dur, socket_address
from controlplane.translate.routes import PerRoute
from controlplane.translate.tls import (
    PLAINTEXT_REFUSAL,
    chain_matches,
    client_cert_forwarding,
    downstream_transport_socket,
    tls_inspector,
)
from controlplane.translate.usage_meter import (
    LUA_FILTER,
    meters_usage,
    usage_access_log,
    usage_http_filter,
    usage_per_route,
)
from policy.batch_checks import batch_line_routes
from policy.model import Address, Downstream, Gateway, Policy, Route
from policy.tls import GatewayTls

__all__ = ["gateway_listener", "route_hooks", "sidecar_listener"]

HCM = hcm_pb2.HttpConnectionManager


def route_hooks(
    policy: Policy, routes: tuple[Route, ...]
) -> tuple[list[hcm_pb2.HttpFilter], list[PerRoute]]:
    """The optional HTTP filters a set of routes needs, and their per-route config makers."""
    filters: list[hcm_pb2.HttpFilter] = []
    per_route: list[PerRoute] = []
    if policy.filters is not None and any(
        r.filters is not None and r.filters.enabled for r in routes
    ):
        from controlplane.translate.ext_proc import ext_proc_http_filter, ext_proc_per_route

        if any(meters_usage(r) for r in routes):
            filters.append(usage_http_filter())
            per_route.append(usage_per_route)
        filters.append(ext_proc_http_filter(policy))
        per_route.append(ext_proc_per_route)
    if policy.ratelimit is not None and any(
        r.rate_limit is not None and r.rate_limit.enabled for r in routes
    ):
        from controlplane.translate.ratelimit import ratelimit_http_filter, ratelimit_per_route

        filters.append(ratelimit_http_filter(policy))
        per_route.append(functools.partial(ratelimit_per_route, priced=batch_line_routes(policy)))
    return filters, per_route


def gateway_listener(
    node: str,
    gw: Gateway,
    extra_filters: list[hcm_pb2.HttpFilter],
    tracing: hcm_pb2.HttpConnectionManager.Tracing | None = None,
) -> listener_pb2.Listener:
    return _listener(
        names.listener_name(node, "gateway"),
        gw.listen,
        names.route_config_name(node, "gateway"),
        extra_filters,
        edge=True,
        max_headers_kb=gw.max_request_headers_kb,
        downstream=gw.downstream,
        tracing=tracing,
        access_log=access_logs(gw.access_log)
        + ([usage_access_log()] if any(f.name == LUA_FILTER for f in extra_filters) else []),
        node=node,
        tls=gw.tls,
    )


def sidecar_listener(
    node: str,
    kind: str,
    listen: Address,
    downstream: Downstream,
    tracing: hcm_pb2.HttpConnectionManager.Tracing | None = None,
) -> listener_pb2.Listener:
    return _listener(
        names.listener_name(node, kind),
        listen,
        names.route_config_name(node, kind),
        [],
        edge=False,
        downstream=downstream,
        tracing=tracing,
    )


def _listener(
    name: str,
    listen: Address,
    route_config: str,
    extra_filters: list[hcm_pb2.HttpFilter],
    *,
    edge: bool,
    downstream: Downstream,
    max_headers_kb: int = 60,
    tracing: hcm_pb2.HttpConnectionManager.Tracing | None = None,
    access_log: list[accesslog_pb2.AccessLog] | None = None,
    node: str = "",
    tls: GatewayTls | None = None,
) -> listener_pb2.Listener:
    router = hcm_pb2.HttpFilter(
        name="envoy.filters.http.router", typed_config=any_of(router_pb2.Router())
    )
    hcm = HCM(
        stat_prefix=name,
        codec_type=HCM.AUTO,
        rds=hcm_pb2.Rds(config_source=ads_source(), route_config_name=route_config),
        http_filters=[*extra_filters, router],
        use_remote_address=_bool(edge),
        stream_idle_timeout=dur(300),
        request_timeout=dur(0),
        request_headers_timeout=dur(downstream.request_headers_timeout),
        max_request_headers_kb=_u32(max_headers_kb),
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(
            idle_timeout=dur(downstream.idle_timeout)
        ),
        access_log=access_log or [],
    )
    if tracing is not None:  # policy `tracing`: controlplane.translate.tracing
        hcm.tracing.CopyFrom(tracing)
    if edge:
        hcm.early_header_mutation_extensions.append(strip_internal_headers())
        hcm.local_reply_config.CopyFrom(openai_local_replies())
    client_cert_forwarding(hcm, tls)
    limit = connection_limit_pb2.ConnectionLimit(
        stat_prefix=name, max_connections=_u64(downstream.max_connections)
    )
    filters = [
        listener_components_pb2.Filter(
            name="envoy.filters.network.connection_limit", typed_config=any_of(limit)
        ),
        listener_components_pb2.Filter(
            name="envoy.filters.network.http_connection_manager", typed_config=any_of(hcm)
        ),
    ]
    listener = listener_pb2.Listener(
        name=name,
        address=socket_address(listen.host, listen.port),
        per_connection_buffer_limit_bytes=_u32(1024 * 1024),
    )
    if tls is None:
        listener.filter_chains.append(listener_components_pb2.FilterChain(filters=filters))
        return listener
    # HTTPS: one chain per certificate by SNI, the default chain, and plain HTTP refused
    listener.listener_filters.append(tls_inspector())
    for index, server_names in chain_matches(tls):
        listener.filter_chains.append(
            listener_components_pb2.FilterChain(
                filter_chain_match=listener_components_pb2.FilterChainMatch(
                    server_names=list(server_names), transport_protocol="tls"
                ),
                filters=filters,
                transport_socket=downstream_transport_socket(node, tls, index),
            )
        )
    listener.filter_chains.append(_plaintext_refused(name, router))
    return listener


def _plaintext_refused(
    name: str, router: hcm_pb2.HttpFilter
) -> listener_components_pb2.FilterChain:
    """Plain HTTP on a TLS port: one ``400`` saying to use https, then the connection closes."""
    body = {
        "error": {
            "message": PLAINTEXT_REFUSAL,
            "type": "invalid_request_error",
            "code": "tls_required",
        }
    }
    reply = rc.Route(
        match=rc.RouteMatch(prefix="/"),
        direct_response=rc.DirectResponseAction(
            status=400, body=base_pb2.DataSource(inline_string=json.dumps(body))
        ),
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value="application/json")
            )
        ],
    )
    hcm = HCM(
        stat_prefix=f"{name}_plaintext",
        codec_type=HCM.AUTO,
        route_config=route_pb2.RouteConfiguration(
            name=f"{name}_plaintext",
            virtual_hosts=[rc.VirtualHost(name="tls_only", domains=["*"], routes=[reply])],
        ),
        http_filters=[router],
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(
            max_requests_per_connection=_u32(1), idle_timeout=dur(5)
        ),
    )
    return listener_components_pb2.FilterChain(
        filter_chain_match=listener_components_pb2.FilterChainMatch(
            transport_protocol="raw_buffer"
        ),
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager", typed_config=any_of(hcm)
            )
        ],
    )


def _u64(v: int):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from google.protobuf import wrappers_pb2

    return wrappers_pb2.UInt64Value(value=v)


def _u32(v: int):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from controlplane.translate.protos import u32

    return u32(v)


def _bool(v: bool):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from google.protobuf import wrappers_pb2

    return wrappers_pb2.BoolValue(value=v)
