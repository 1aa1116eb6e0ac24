from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenweir.envoy_launcher import (
    XDS_CLUSTER,
    EnvoyProcess,
    EnvoySettings,
    EnvoyStartError,
    render_bootstrap,
    validate,
)

SETTINGS = EnvoySettings(node_id="edge-1", node_cluster="edge", xds_port=18000, base_id=4242)


def test_bootstrap_uses_ads_over_the_static_xds_cluster() -> None:
    sotw = render_bootstrap(SETTINGS)
    assert sotw["node"] == {"id": "edge-1", "cluster": "edge"}
    ads = sotw["dynamic_resources"]["ads_config"]
    assert ads["api_type"] == "GRPC" and ads["transport_api_version"] == "V3"
    assert ads["grpc_services"][0]["envoy_grpc"]["cluster_name"] == XDS_CLUSTER
    assert sotw["dynamic_resources"]["cds_config"]["resource_api_version"] == "V3"
    (cluster,) = sotw["static_resources"]["clusters"]
    assert cluster["name"] == XDS_CLUSTER
    options = next(iter(cluster["typed_extension_protocol_options"].values()))
    assert "http2_protocol_options" in options["explicit_http_config"]
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert address["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18000}
    delta = render_bootstrap(EnvoySettings(**{**SETTINGS.__dict__, "delta": True}))
    admin = render_bootstrap(EnvoySettings(**{**SETTINGS.__dict__, "admin_port": 9901}))
    assert admin["node"]["metadata"] == {"tokenweir_admin": "127.0.0.1:9901"}  # the dashboard's
    assert delta["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"


@pytest.mark.parametrize("delta", [False, True])
def test_rendered_bootstrap_passes_envoy_validate(delta: bool) -> None:
    settings = EnvoySettings(
        **{**SETTINGS.__dict__, "delta": delta, "stats_inclusion": (r"^cluster_manager\.",)}
    )
    ok, message = validate(render_bootstrap(settings))
    assert ok, message


def test_validate_reports_envoy_message_for_a_bad_config() -> None:
    config = render_bootstrap(SETTINGS)
    config["static_resources"]["clusters"][0]["connect_timeout"] = "-1s"
    ok, message = validate(config)
    assert not ok
    assert "Invalid duration" in message, message


async def test_a_failing_envoy_raises_with_its_log(tmp_path: Path) -> None:
    process = EnvoyProcess(
        EnvoySettings(**{**SETTINGS.__dict__, "log_level": "no-such-level"}), tmp_path
    )
    with pytest.raises(EnvoyStartError, match="exited"):
        await process.start(timeout=20)
    assert not process.alive()


def test_argv_carries_base_id_and_concurrency(tmp_path: Path) -> None:
    argv = EnvoyProcess(SETTINGS, tmp_path).argv()
    assert argv[argv.index("--base-id") + 1] == "4242"
    assert argv[argv.index("--concurrency") + 1] == "1"
    assert Path(argv[0]).name == "envoy"


def test_example_bootstrap_in_envoy_folder_is_what_the_launcher_renders() -> None:
    example = Path(__file__).resolve().parents[2] / "envoy" / "bootstrap.example.json"
    settings = EnvoySettings(
        node_id="edge-1", node_cluster="edge", xds_port=18000, base_id=1, admin_port=19000
    )
    assert json.loads(example.read_text()) == render_bootstrap(settings), (
        "envoy/bootstrap.example.json is stale: rewrite it with json.dumps(render_bootstrap("
        "EnvoySettings(node_id='edge-1', node_cluster='edge', xds_port=18000, base_id=1, "
        "admin_port=19000)), indent=2)"
    )


def test_bootstrap_caps_client_connections_but_not_the_admin_port() -> None:
    b = render_bootstrap(
        EnvoySettings(
            node_id="n", node_cluster="c", xds_port=1, base_id=1, max_downstream_connections=777
        )
    )
    (monitor,) = b["overload_manager"]["resource_monitors"]
    assert monitor["name"] == "envoy.resource_monitors.global_downstream_max_connections"
    assert monitor["typed_config"]["max_active_downstream_connections"] == 777
    assert b["admin"]["ignore_global_conn_limit"] is True
