"""A pool whose ladder has a fallback step gets a route to the fallback pool, matched on the
header the degrade plugin sets, ahead of the lane routes."""

from __future__ import annotations

from controlplane.translate.routes import gateway_routes
from policy import load_policy_text

POLICY = """
version: 1
filters: {}
pools:
  chat:
    models: [big]
    endpoints: [127.0.0.1:9001]
    fallback: small
    degradation:
      steps:
        - {action: fallback, enter_at: 1.0, leave_at: 0.8, lanes: [batch]}
  small:
    models: [tiny]
    endpoints: [127.0.0.1:9002]
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {plugins: [lane, PLUGINS]}
"""


def _routes(plugins: str) -> list:
    policy = load_policy_text(POLICY.replace("PLUGINS", plugins))
    cfg = gateway_routes(policy, "edge", policy.gateways["edge"], [])
    return list(cfg.virtual_hosts[0].routes)


def test_fallback_route_is_matched_first_on_the_degrade_header() -> None:
    routes = _routes("degrade, tokens")
    by_name = [r.name for r in routes]
    assert "llm/fallback" in by_name
    first = by_name.index("llm/fallback")
    assert first < by_name.index("llm/interactive") and first < by_name.index("llm")
    fb = routes[first]
    assert fb.route.cluster == "pool_small"
    assert [(h.name, h.string_match.exact) for h in fb.match.headers] == [
        ("x-tokenweir-degrade", "fallback")
    ]
    assert routes[by_name.index("llm")].route.cluster != "pool_small"


def test_no_fallback_route_without_the_degrade_plugin() -> None:
    assert "llm/fallback" not in [r.name for r in _routes("tokens")]
