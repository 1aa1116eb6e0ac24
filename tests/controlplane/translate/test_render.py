"""Translation policy → Envoy resources: golden files, real ``envoy --mode validate``, semantics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from controlplane.reloader import snapshots_for
from controlplane.translate.render import render, to_json
from controlplane.translate.static import static_bootstrap
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from policy import load_policy
from tokenweir.envoy_launcher import validate

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
ENVOY = (
    Path(os.environ.get("VIRTUAL_ENV", Path(__file__).resolve().parents[3] / ".venv"))
    / "bin"
    / "envoy"
)


@pytest.fixture(scope="module")
def groups() -> dict:
    return render(load_policy(GOLDEN / "mesh.yaml"))


def test_render_matches_golden_file(groups: dict) -> None:
    got = json.dumps(to_json(groups), indent=1, sort_keys=True) + "\n"
    golden = GOLDEN / "mesh.rendered.json"
    if os.environ.get("TOKENWEIR_UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text(), (
        "rendered resources changed; review and rerun with TOKENWEIR_UPDATE_GOLDEN=1"
    )


def test_render_is_deterministic_and_pure() -> None:
    policy = load_policy(GOLDEN / "mesh.yaml")
    a, b = snapshots_for(render(policy)), snapshots_for(render(policy))
    assert {g: s.version for g, s in a.items()} == {g: s.version for g, s in b.items()}


def test_every_snapshot_is_consistent(groups: dict) -> None:
    for snap in snapshots_for(groups).values():
        snap.check()


@pytest.mark.parametrize("node", ["edge", "inventory-sidecar"])
def test_envoy_accepts_rendered_config(groups: dict, node: str) -> None:
    ok, message = validate(static_bootstrap(groups[node], node_id=node))
    assert ok, message


def test_each_node_gets_only_its_own_resources(groups: dict) -> None:
    edge, side = groups["edge"], groups["inventory-sidecar"]
    assert set(edge[LISTENER]) == {"edge_gateway"}
    assert set(side[LISTENER]) == {"inventory-sidecar_inbound", "inventory-sidecar_outbound"}
    assert (
        "local_inventory-sidecar" in side[CLUSTER]
        and "local_inventory-sidecar" not in edge[CLUSTER]
    )
    assert set(edge[CLUSTER]) == {
        "pool_chat",
        "pool_spare",
        "pool_chat_with_fallback",
        "svc_inventory",
    }
    assert set(edge[ENDPOINT]) == {"pool_chat", "pool_spare", "svc_inventory"}


def test_pool_cluster_has_ring_hash_bounded_load_and_lane_breakers(groups: dict) -> None:
    c = MessageToDict(groups["edge"][CLUSTER]["pool_chat"])
    assert c["lbPolicy"] == "RING_HASH"
    assert c["commonLbConfig"]["consistentHashingLbConfig"]["hashBalanceFactor"] == 150
    by_prio = {t.get("priority", "DEFAULT"): t for t in c["circuitBreakers"]["thresholds"]}
    assert (
        by_prio["HIGH"]["maxPendingRequests"] == 100
        and by_prio["DEFAULT"]["maxPendingRequests"] == 10
    )
    assert c["outlierDetection"]["consecutive5xx"] == 5
    assert c["healthChecks"][0]["httpHealthCheck"]["path"] == "/health"
    spare = MessageToDict(groups["edge"][CLUSTER]["pool_spare"])
    assert "consistentHashingLbConfig" not in spare.get("commonLbConfig", {})
    assert "healthChecks" not in spare


def test_routes_hash_on_session_then_prefix_and_never_time_out_streams(groups: dict) -> None:
    rc = MessageToDict(groups["edge"][ROUTE]["edge_gateway_routes"])
    routes = {r["name"]: r for vh in rc["virtualHosts"] for r in vh["routes"]}
    chat = routes["chat"]["route"]
    assert [h["header"]["headerName"] for h in chat["hashPolicy"]] == [
        "x-session-id",
        "x-prefix-hash",
    ]
    assert all(h["terminal"] for h in chat["hashPolicy"])
    assert chat["timeout"] == "0s" and chat["idleTimeout"] == "60s"
    assert chat["cluster"] == "pool_chat_with_fallback"
    assert routes["interactive-chat"]["route"]["priority"] == "HIGH"
    assert chat.get("priority", "DEFAULT") == "DEFAULT"
    assert chat["retryPolicy"]["numRetries"] == 2


def test_services_get_their_own_virtual_host_and_timeouts(groups: dict) -> None:
    rc = MessageToDict(groups["edge"][ROUTE]["edge_gateway_routes"])
    vh = next(v for v in rc["virtualHosts"] if v["domains"] == ["api.example.com"])
    (route,) = vh["routes"]
    assert route["route"]["cluster"] == "svc_inventory" and route["route"]["timeout"] == "15s"
    out = MessageToDict(groups["inventory-sidecar"][ROUTE]["inventory-sidecar_outbound_routes"])
    domains = {v["name"]: v["domains"] for v in out["virtualHosts"]}
    assert "inventory.local:*" in domains["inventory-sidecar_out_inventory"]


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mesh.yaml"


@pytest.mark.parametrize("node", ["edge", "inventory-sidecar"])
def test_example_policy_with_filters_and_ratelimit_is_accepted_by_envoy(node: str) -> None:
    groups = render(load_policy(EXAMPLE))
    for snap in snapshots_for(groups).values():
        snap.check()
    ok, message = validate(static_bootstrap(groups[node], node_id=node))
    assert ok, message


def test_example_gateway_chain_is_lua_meter_ext_proc_ratelimit_router() -> None:
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    groups = render(load_policy(EXAMPLE))
    listener = groups["edge"][LISTENER]["edge_gateway"]
    hcm = hcm_pb2.HttpConnectionManager()
    chain = listener.filter_chains[0].filters
    # the connection limit comes first: excess connections never reach HTTP parsing
    assert [f.name for f in chain] == [
        "envoy.filters.network.connection_limit",
        "envoy.filters.network.http_connection_manager",
    ]
    chain[1].typed_config.Unpack(hcm)
    assert hcm.request_headers_timeout.seconds == 10
    assert hcm.common_http_protocol_options.idle_timeout.seconds == 300
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.lua",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.ratelimit",
        "envoy.filters.http.router",
    ]
    assert {"tokenweir_filters", "tokenweir_ratelimit"} <= set(groups["edge"][CLUSTER])
    assert "tokenweir_filters" not in groups["inventory-sidecar"][CLUSTER]
    rc = MessageToDict(groups["edge"][ROUTE]["edge_gateway_routes"])
    routes = {r["name"]: r for vh in rc["virtualHosts"] for r in vh["routes"]}
    assert routes["chat-completions/interactive"]["route"]["priority"] == "HIGH"
    inventory_cfg = routes["inventory"].get("typedPerFilterConfig", {})
    assert inventory_cfg, "the plain service route must switch the LLM filters off per route"
    assert inventory_cfg["envoy.filters.http.lua"]["disabled"] is True
    chat = routes["chat-completions/interactive"]["typedPerFilterConfig"]
    assert "envoy.filters.http.lua" not in chat  # the usage meter runs there
    mode = chat["envoy.filters.http.ext_proc"]["overrides"]["processingMode"]
    # the response body no longer goes to the filter server: Envoy's Lua meter reads it
    assert mode.get("responseBodyMode", "NONE") == "NONE"
    assert mode["requestBodyMode"] == "BUFFERED"
    logs = [a["name"] for a in MessageToDict(hcm)["accessLog"]]
    assert "envoy.access_loggers.http_grpc" in logs


def test_multi_process_servers_get_several_http2_connections() -> None:
    text = EXAMPLE.read_text().replace("  domain: tokenweir", "  domain: tokenweir\n  replicas: 2")
    from policy import load_policy_text

    clusters = render(load_policy_text(text))["edge"][CLUSTER]
    opts = MessageToDict(clusters["tokenweir_ratelimit"])["typedExtensionProtocolOptions"]
    (http,) = opts.values()
    assert http["explicitHttpConfig"]["http2ProtocolOptions"]["maxConcurrentStreams"] == 16
    single = MessageToDict(clusters["tokenweir_filters"])["typedExtensionProtocolOptions"]
    (http,) = single.values()
    assert "maxConcurrentStreams" not in http["explicitHttpConfig"]["http2ProtocolOptions"]
