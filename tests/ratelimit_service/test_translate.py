"""controlplane/translate/ratelimit.py: the filter-level rate_limits the service relies on."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2

from controlplane.translate.ratelimit import (
    RATELIMIT_FILTER,
    RESERVE_FORMAT,
    SETTLE_FORMAT,
    ratelimit_http_filter,
    ratelimit_per_route,
)
from policy import load_policy_text
from policy.model import Route, RouteRateLimit

POLICY = """
version: 1
ratelimit: {address: 127.0.0.1:18081, domain: acme-mesh, timeout: 40ms, failure_mode_deny: true}
"""


def _entries(limit: rc.RateLimit) -> list[tuple[str, str]]:
    out = []
    for a in limit.actions:
        if a.HasField("request_headers"):
            out.append((a.request_headers.descriptor_key, a.request_headers.header_name))
        elif a.HasField("generic_key"):
            out.append((a.generic_key.descriptor_key, a.generic_key.descriptor_value))
        elif a.HasField("remote_address"):
            out.append(("remote_address", ""))
    return out


def test_filter_level_reserve_and_settle_entries() -> None:
    f = ratelimit_http_filter(load_policy_text(POLICY))
    assert f.name == RATELIMIT_FILTER
    cfg = rate_limit_pb2.RateLimit()
    assert f.typed_config.Unpack(cfg)
    assert cfg.domain == "acme-mesh" and cfg.failure_mode_deny
    assert cfg.timeout.ToMilliseconds() == 40
    assert cfg.enable_x_ratelimit_headers == rate_limit_pb2.RateLimit.DRAFT_VERSION_03
    assert not cfg.rate_limited_as_resource_exhausted
    assert cfg.rate_limit_service.grpc_service.envoy_grpc.cluster_name == "tokenweir_ratelimit"
    reserve, settle = cfg.rate_limits
    common = [
        ("tenant", "x-tokenweir-tenant"),
        ("model", "x-tokenweir-model"),
        ("lane", "x-tokenweir-lane"),
        ("request_id", "x-request-id"),
    ]
    assert _entries(reserve) == [*common, ("phase", "reserve")]
    assert _entries(settle) == [*common, ("phase", "settle")]
    assert reserve.hits_addend.format == RESERVE_FORMAT and not reserve.apply_on_stream_done
    assert settle.hits_addend.format == SETTLE_FORMAT and settle.apply_on_stream_done


def test_per_route_configs() -> None:
    off = ratelimit_per_route(Route(name="a", pool="p"))
    cfg = rc.FilterConfig()
    assert off[RATELIMIT_FILTER].Unpack(cfg) and cfg.disabled
    assert ratelimit_per_route(Route(name="b", pool="p", rate_limit=RouteRateLimit())) == {}
    svc = ratelimit_per_route(Route(name="c", service="inv", rate_limit=RouteRateLimit()))
    per = rate_limit_pb2.RateLimitPerRoute()
    assert svc[RATELIMIT_FILTER].Unpack(per)
    assert _entries(per.rate_limits[0]) == [
        ("service", "inv"),
        ("remote_address", ""),
        ("phase", "requests"),
    ]
    no_settle = Route(name="d", pool="p", rate_limit=RouteRateLimit(settle_on_stream_done=False))
    per = rate_limit_pb2.RateLimitPerRoute()
    assert ratelimit_per_route(no_settle)[RATELIMIT_FILTER].Unpack(per)
    assert [r.apply_on_stream_done for r in per.rate_limits] == [False]


def test_a_batch_line_route_names_itself_on_its_descriptors() -> None:
    """The rate-limit service prices a batch line's reservation by its route (issue 41)."""
    lines = Route(name="batch-lines", pool="p", rate_limit=RouteRateLimit())
    per = rate_limit_pb2.RateLimitPerRoute()
    assert ratelimit_per_route(lines, frozenset({"batch-lines"}))[RATELIMIT_FILTER].Unpack(per)
    assert [("route", "batch-lines") in _entries(r) for r in per.rate_limits] == [True, True]
    assert [r.apply_on_stream_done for r in per.rate_limits] == [False, True]
    assert ratelimit_per_route(lines) == {}  # not a batch-line route: the filter's own entries
