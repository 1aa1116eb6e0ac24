"""pools.NAME.routing.mode prefix_index, and a ranked pool balanced by lane
(priority_scheduling, balance lane) → the override-host load balancer with ring hash behind it."""

from __future__ import annotations

import pytest
from google.protobuf.json_format import MessageToDict

from controlplane.translate.render import render
from controlplane.translate.static import static_bootstrap
from controlplane.xds.types import CLUSTER
from policy import load_policy_text
from tokenweir.envoy_launcher import validate

POLICY = """
version: 1
filters: {address: 127.0.0.1:18082}
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:30001, 127.0.0.1:30002]
    affinity: {hash_balance_factor: 125}
    routing: {mode: MODE}
    priority_scheduling: RANKED
gateways:
  edge:
    routes:
      - {name: chat, pool: chat, filters: {plugins: [tokens, picker]}}
"""


def _cluster(mode: str, ranked: str = "{enabled: false}") -> tuple[dict, dict]:
    text = POLICY.replace("MODE", mode).replace("RANKED", ranked)
    groups = render(load_policy_text(text, "mesh.yaml"))
    return MessageToDict(groups["edge"][CLUSTER]["pool_chat"]), groups["edge"]


@pytest.mark.parametrize(
    ("mode", "ranked"),
    [("prefix_index", "{enabled: false}"), ("ring_hash", "{enabled: true}")],
    ids=["prefix_index", "ranked_lane_balance"],
)
def test_named_hosts_render_override_host_with_bounded_ring_hash_fallback(
    mode: str, ranked: str
) -> None:
    c, edge = _cluster(mode, ranked)
    assert "lbPolicy" not in c  # the typed policy replaces the enum
    (policy,) = c["loadBalancingPolicy"]["policies"]
    override = policy["typedExtensionConfig"]
    assert override["name"] == "envoy.load_balancing_policies.override_host"
    cfg = override["typedConfig"]
    assert cfg["overrideHostSources"] == [{"header": "x-tokenweir-endpoint"}]
    (fallback,) = cfg["fallbackPolicy"]["policies"]
    assert fallback["typedExtensionConfig"]["name"] == "envoy.load_balancing_policies.ring_hash"
    ring = fallback["typedExtensionConfig"]["typedConfig"]
    assert ring["consistentHashingLbConfig"]["hashBalanceFactor"] == 125
    assert c["commonLbConfig"]["healthyPanicThreshold"] == {}  # 0: never spray unhealthy hosts
    ok, message = validate(static_bootstrap(edge, node_id="edge"))
    assert ok, message


@pytest.mark.parametrize("ranked", ["{enabled: false}", "{enabled: true, balance: ring}"])
def test_ring_hash_mode_is_unchanged(ranked: str) -> None:
    c, _ = _cluster("ring_hash", ranked)
    assert c["lbPolicy"] == "RING_HASH" and "loadBalancingPolicy" not in c
