"""The usage meter in Envoy: a Lua HTTP filter and a gRPC access log to the filter server. Pure.

Why in Envoy: with the response body STREAMED through ext_proc, every SSE chunk was one message
to the Python filter server (issue 12: ~26 messages per trace request). The Lua filter
(``usage.lua``, next to this module) does the per-chunk work in the gateway: it keeps
``tokenweir.settle_tokens`` / ``settle_usd_micros`` truthful for the rate-limit filter's
stream-done settle call, cuts the usage-only event the client did not ask for, and keeps a small
summary of the stream in dynamic metadata. Envoy's gRPC access logger then ships that metadata,
in batches, to the filter server (``AccessLogService`` on the same port), which records the
gateway metrics (TTFT, TBT, tokens, cost, outcome: docs/metrics.md) at the end of every metered
request, abandoned ones included. The filter chain is Lua → ext_proc → ratelimit → router: Lua
sees the request first (the TTFT clock starts there) and, on the way back, every answer last
(the rate-limit filter's 429, and chunks a custom plugin rewrote through ext_proc).

Per route: the Lua filter runs only on pool routes whose plugins list ``usage`` and where no other
plugin reads the response body (:func:`meters_usage`); elsewhere it is disabled through
``typed_per_filter_config``, and the Python usage plugin meters as before.
"""

from __future__ import annotations

from importlib.resources import files

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import metadata_pb2 as metadata_matcher_pb2
from envoy.type.matcher.v3 import value_pb2

from controlplane.translate.names import FILTERS_CLUSTER
from controlplane.translate.protos import Packed, any_of, dur, u32
from policy.model import Route
from policy.phases import meters_usage
from wire.contract import METADATA_NAMESPACE

__all__ = [
    "GAP_BUCKETS",
    "LUA_FILTER",
    "USAGE_LOG_NAME",
    "lua_source",
    "meters_usage",
    "usage_access_log",
    "usage_http_filter",
    "usage_per_route",
]

LUA_FILTER = "envoy.filters.http.lua"
USAGE_LOG_NAME = "tokenweir_usage"
# the tbt histogram's buckets (seconds): filters/metrics.py uses the same tuple
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_SOURCE = files(__package__).joinpath("usage.lua").read_text(encoding="utf-8")


def lua_source() -> str:
    """The meter's Lua code with the bucket bounds filled in (microseconds)."""
    return _SOURCE.replace("__GAP__", ", ".join(str(round(b * 1e6)) for b in GAP_BUCKETS))


def usage_http_filter() -> hcm_pb2.HttpFilter:
    cfg = lua_pb2.Lua(
        default_source_code=base_pb2.DataSource(inline_string=lua_source()),
        stat_prefix="tokenweir_usage",
    )
    return hcm_pb2.HttpFilter(name=LUA_FILTER, typed_config=any_of(cfg))


def usage_per_route(route: Route) -> dict[str, Packed]:
    if meters_usage(route):
        return {}
    return {LUA_FILTER: any_of(rc.FilterConfig(disabled=True))}


def usage_access_log() -> accesslog_pb2.AccessLog:
    """Every metered request (``tokenweir.meter`` set by the filter server) → the filter server,
    batched: at most every 200 ms or 64 KiB, whichever comes first."""
    present = metadata_matcher_pb2.MetadataMatcher(
        filter=METADATA_NAMESPACE,
        path=[metadata_matcher_pb2.MetadataMatcher.PathSegment(key="meter")],
        value=value_pb2.ValueMatcher(present_match=True),
    )
    cfg = als_pb2.HttpGrpcAccessLogConfig(
        common_config=als_pb2.CommonGrpcAccessLogConfig(
            log_name=USAGE_LOG_NAME,
            grpc_service=grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=FILTERS_CLUSTER)
            ),
            transport_api_version=config_source_pb2.V3,
            buffer_flush_interval=dur(0.2),
            buffer_size_bytes=u32(65536),
        ),
        # the filter server makes the request's usage span from the entry (its trace's parent)
        additional_request_headers_to_log=["traceparent", "tracestate"],
    )
    return accesslog_pb2.AccessLog(
        name="envoy.access_loggers.http_grpc",
        filter=accesslog_pb2.AccessLogFilter(
            metadata_filter=accesslog_pb2.MetadataFilter(matcher=present)
        ),
        typed_config=any_of(cfg),
    )
