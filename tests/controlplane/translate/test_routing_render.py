"""pools.NAME.routing.mode prefix_index → the override-host load balancer with ring hash behind it."""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict

from controlplane.envoy_launcher import validate
from controlplane.policy import load_policy_text
from controlplane.translate.render import render
from controlplane.translate.static import static_bootstrap
from controlplane.xds.types import CLUSTER

POLICY = """
version: 1
filters: {address: 127.0.0.1:18082}
pools:
  chat:
    models: [m]
    endpoints: [127.0.0.1:30001, 127.0.0.1:30002]
    affinity: {hash_balance_factor: 125}
    routing: {mode: MODE}
gateways:
  edge:
    routes:
      - {name: chat, pool: chat, filters: {plugins: [tokens, picker]}}
"""


def _cluster(mode: str) -> tuple[dict, dict]:
    groups = render(load_policy_text(POLICY.replace("MODE", mode), "mesh.yaml"))
    return MessageToDict(groups["edge"][CLUSTER]["pool_chat"]), groups["edge"]


def test_prefix_index_renders_override_host_with_bounded_ring_hash_fallback() -> None:
    c, edge = _cluster("prefix_index")
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


def test_ring_hash_mode_is_unchanged() -> None:
    c, _ = _cluster("ring_hash")
    assert c["lbPolicy"] == "RING_HASH" and "loadBalancingPolicy" not in c
