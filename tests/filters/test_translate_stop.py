"""A route whose usage plugin stops streams at the budget: metered in Python (never by Envoy's
Lua meter), response headers and every chunk to the filter server, and Envoy names the replica
that answered in ``x-tokenweir-upstream`` (accepted by ``envoy --mode validate``)."""

from __future__ import annotations

from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2

from controlplane.translate.ext_proc import EXT_PROC_FILTER, ext_proc_per_route
from policy import load_policy_text
from policy.phases import UPSTREAM_HEADER, meters_usage, stops_at_budget

PM = processing_mode_pb2.ProcessingMode

POLICY = """
version: 1
filters: {address: 127.0.0.1:18082, message_timeout: 300ms}
pools: {chat: {models: [m1], endpoints: [127.0.0.1:9000]}}
gateways:
  edge:
    listen: 127.0.0.1:18080
    routes:
      - name: stop
        pool: chat
        match: {prefix: /v1/}
        filters:
          plugins: [identity, tokens, {name: usage, settings: {stop_at_budget: true}}]
      - name: lua
        pool: chat
        match: {prefix: /l/}
        filters: {plugins: [identity, tokens, usage]}
"""


def test_a_stop_route_meters_in_python_and_names_its_replica() -> None:
    from controlplane.translate.render import ROUTE, render
    from controlplane.translate.static import static_bootstrap
    from tokenweir.envoy_launcher import validate

    policy = load_policy_text(POLICY)
    routes = {r.name: r for r in policy.gateways["edge"].routes}
    assert stops_at_budget(routes["stop"]) and not meters_usage(routes["stop"])
    assert meters_usage(routes["lua"]) and not stops_at_budget(routes["lua"])
    msg = ext_proc_pb2.ExtProcPerRoute()
    assert ext_proc_per_route(routes["stop"])[EXT_PROC_FILTER].Unpack(msg)
    mode = msg.overrides.processing_mode
    assert mode.response_header_mode == PM.SEND and mode.response_body_mode == PM.STREAMED
    groups = render(policy)
    vh = groups["edge"][ROUTE]["edge_gateway_routes"].virtual_hosts[0]
    added = {
        r.name: {h.header.key: h.header.value for h in r.response_headers_to_add} for r in vh.routes
    }
    assert added["stop"] == {UPSTREAM_HEADER: "%UPSTREAM_HOST%"}
    assert UPSTREAM_HEADER not in added["lua"]
    ok, message = validate(static_bootstrap(groups["edge"], node_id="edge"))
    assert ok, message
