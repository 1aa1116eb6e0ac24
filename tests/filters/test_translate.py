from __future__ import annotations

import json

from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2

from controlplane.translate.ext_proc import (
    EXT_PROC_FILTER,
    ext_proc_http_filter,
    ext_proc_per_route,
)
from policy import load_policy_text

PM = processing_mode_pb2.ProcessingMode

POLICY = """
version: 1
filters: {address: 127.0.0.1:18082, message_timeout: 300ms}
pools: {chat: {models: [m1], endpoints: [127.0.0.1:9000]}}
services: {inv: {endpoints: [127.0.0.1:9001]}}
gateways:
  edge:
    routes:
      - name: full
        pool: chat
        match: {prefix: /v1/}
        filters: {plugins: [identity, tokens, prefix, lane, usage], failure_mode: open}
      - name: python-meter
        pool: chat
        match: {prefix: /p/}
        filters: {plugins: [identity, tokens, usage], usage_meter: python}
      - name: usage-and-custom
        pool: chat
        match: {prefix: /uc/}
        filters: {plugins: [identity, usage, "examples.plugins.redact:RedactPlugin"]}
      - name: auth-only
        pool: chat
        match: {prefix: /a/}
        filters: {plugins: [identity]}
      - name: custom
        pool: chat
        match: {prefix: /c/}
        filters: {plugins: ["examples.plugins.redact:RedactPlugin"]}
      - name: admitted
        pool: chat
        match: {prefix: /ad/}
        filters: {plugins: [identity, lane, admission]}
      - name: admitted-metered
        pool: chat
        match: {prefix: /am/}
        filters: {plugins: [identity, tokens, lane, admission, usage]}
      - name: admitted-python-meter
        pool: chat
        match: {prefix: /ap/}
        filters: {plugins: [identity, tokens, admission, usage], usage_meter: python}
      - name: inventory
        service: inv
        match: {prefix: /inv/}
"""


from policy.phases import meters_usage  # noqa: E402


def per_route(name: str) -> ext_proc_pb2.ExtProcPerRoute:
    policy = load_policy_text(POLICY)
    route = next(r for r in policy.gateways["edge"].routes if r.name == name)
    cfg = ext_proc_per_route(route)
    msg = ext_proc_pb2.ExtProcPerRoute()
    assert cfg[EXT_PROC_FILTER].Unpack(msg)
    return msg


def test_filter_level_config() -> None:
    f = ext_proc_http_filter(load_policy_text(POLICY))
    cfg = ext_proc_pb2.ExternalProcessor()
    assert f.name == EXT_PROC_FILTER and f.typed_config.Unpack(cfg)
    assert cfg.grpc_service.envoy_grpc.cluster_name == "tokenweir_filters"
    # nothing at filter level: a reply Envoy makes before any route is known (a malformed
    # request's 400) must not wait on the filter server; each route sets its own mode
    assert cfg.processing_mode.request_header_mode == PM.SKIP
    assert cfg.processing_mode.response_header_mode == PM.SKIP
    assert cfg.processing_mode.request_body_mode == PM.NONE
    assert cfg.processing_mode.response_body_mode == PM.NONE
    assert list(cfg.metadata_options.receiving_namespaces.untyped) == ["tokenweir"]
    assert cfg.message_timeout.ToMilliseconds() == 300 and not cfg.failure_mode_allow


def test_per_route_modes_route_name_and_failure_mode() -> None:
    full = per_route("full")
    o = full.overrides
    assert [(h.key, h.value) for h in o.grpc_initial_metadata] == [("x-tokenweir-route", "full")]
    assert o.failure_mode_allow.value is True
    assert o.processing_mode.request_body_mode == PM.BUFFERED
    assert o.processing_mode.response_header_mode == PM.SKIP
    # the usage plugin's response is read by Envoy's Lua meter: no chunk to the filter server
    assert o.processing_mode.response_body_mode == PM.NONE
    py = per_route("python-meter").overrides.processing_mode
    assert py.response_body_mode == PM.STREAMED and py.response_header_mode == PM.SKIP
    # a custom plugin reads the body: the Python usage plugin meters there, STREAMED
    both = per_route("usage-and-custom").overrides.processing_mode
    assert both.response_body_mode == PM.STREAMED
    auth = per_route("auth-only").overrides
    assert auth.failure_mode_allow.value is False
    assert auth.processing_mode.request_body_mode == PM.NONE
    assert auth.processing_mode.response_body_mode == PM.NONE
    custom = per_route("custom").overrides.processing_mode  # an imported plugin: every phase
    assert custom.request_body_mode == PM.BUFFERED and custom.response_header_mode == PM.SEND
    assert per_route("inventory").disabled
    policy = load_policy_text(POLICY)
    metered = {r.name for r in policy.gateways["edge"].routes if meters_usage(r)}
    assert metered == {"full", "admitted-metered"}


def test_a_body_over_the_limit_has_its_own_413_route_before_any_filter() -> None:
    from controlplane.translate.render import ROUTE, render
    from controlplane.translate.static import static_bootstrap
    from tokenweir.envoy_launcher import validate

    groups = render(load_policy_text(POLICY))
    vh = groups["edge"][ROUTE]["edge_gateway_routes"].virtual_hosts[0]
    names = [r.name for r in vh.routes]
    assert names[:3] == ["full/too_large", "full/interactive", "full"]
    assert "inventory/too_large" not in names  # an ordinary service's body is not read
    big = vh.routes[0]
    assert big.match.prefix == "/v1/"
    (cl,) = big.match.headers
    limit = vh.routes[1].request_body_buffer_limit.value
    assert cl.name == "content-length" and cl.range_match.start == limit + 1
    assert big.direct_response.status == 413
    assert json.loads(big.direct_response.body.inline_string)["error"]["code"] == 413
    assert set(big.typed_per_filter_config) == {EXT_PROC_FILTER}  # no rate-limit filter here
    # the filter server reads the body to its end (full duplex: Envoy buffers nothing), then 413
    oversize = ext_proc_pb2.ExtProcPerRoute()
    assert big.typed_per_filter_config[EXT_PROC_FILTER].Unpack(oversize)
    mode = oversize.overrides.processing_mode
    assert mode.request_body_mode == PM.FULL_DUPLEX_STREAMED
    assert mode.request_trailer_mode == PM.SEND and mode.response_header_mode == PM.SKIP
    (md,) = oversize.overrides.grpc_initial_metadata
    assert md.value == f"tokenweir.oversize:{limit}"
    assert oversize.overrides.failure_mode_allow.value  # no filter server: the direct 413
    ok, message = validate(static_bootstrap(groups["edge"], node_id="edge"))
    assert ok, message


def test_admission_asks_for_the_response_end_not_its_chunks() -> None:
    """Admission frees its slot at the response's end: no chunk goes to the filter server, but
    the response trailers are asked for, which keeps Envoy's ext_proc stream open to the end
    (tests/integration/test_response_end.py)."""
    only = per_route("admitted").overrides.processing_mode
    assert only.response_body_mode == PM.NONE and only.response_trailer_mode == PM.SEND
    # with usage beside it, Envoy's Lua meter meters: still no chunk to the filter server
    metered = per_route("admitted-metered").overrides.processing_mode
    assert metered.response_body_mode == PM.NONE and metered.response_trailer_mode == PM.SEND
    policy = load_policy_text(POLICY)
    routes = {r.name: r for r in policy.gateways["edge"].routes}
    assert meters_usage(routes["admitted-metered"]) and not meters_usage(routes["admitted"])
    # the Python meter reads every chunk: STREAMED, and no trailers needed for the end
    py = per_route("admitted-python-meter").overrides.processing_mode
    assert py.response_body_mode == PM.STREAMED and py.response_trailer_mode == PM.SKIP
    # routes that need no end keep trailers skipped
    assert per_route("auth-only").overrides.processing_mode.response_trailer_mode == PM.SKIP
