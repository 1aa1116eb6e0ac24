"""A shadowed route mirrors by Envoy's own sampling to the shadow pool, or, with the shadow
plugin, to the cluster the filter server names per request (its recorder's, ORIGINAL_DST)."""

from __future__ import annotations

from controlplane.translate.render import CLUSTER, render
from controlplane.translate.routes import gateway_routes
from policy import load_policy_text

POLICY = """
version: 1
filters: {}
pools:
  chat: {models: [m1], endpoints: [127.0.0.1:9001]}
  next: {models: [m1], endpoints: [127.0.0.1:9002]}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {plugins: [identity, PLUGINS usage]}
        shadow: {pool: next, fraction: 0.25}
"""


def _mirrors(plugins: str) -> list:
    policy = load_policy_text(POLICY.replace("PLUGINS", plugins))
    cfg = gateway_routes(policy, "edge", policy.gateways["edge"], [])
    return [m for r in cfg.virtual_hosts[0].routes for m in r.route.request_mirror_policies]


def test_envoy_samples_without_the_plugin() -> None:
    (m,) = _mirrors("")[:1]
    assert m.cluster == "pool_next" and not m.cluster_header
    assert m.runtime_fraction.default_value.numerator == 250_000


def test_the_plugin_samples_and_names_the_recorder_cluster() -> None:
    mirrors = _mirrors("shadow,")
    assert mirrors and all(
        m.cluster_header == "x-tokenweir-shadow-cluster" and not m.cluster for m in mirrors
    )
    assert "tokenweir_shadow" in _clusters("shadow,") and "pool_next" in _clusters("shadow,")
    rec = _clusters("shadow,")["tokenweir_shadow"]
    assert rec.original_dst_lb_config.http_header_name == "x-tokenweir-shadow-to"
    assert "tokenweir_shadow" not in _clusters("")


def _clusters(plugins: str) -> dict:
    policy = load_policy_text(POLICY.replace("PLUGINS", plugins))
    return dict(render(policy)["edge"][CLUSTER])
