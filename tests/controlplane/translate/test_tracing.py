"""Policy ``tracing`` → Envoy's OpenTelemetry tracer on every HTTP connection manager, its
collector cluster, accepted by real ``envoy --mode validate``; nothing of it without the section."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.trace.v3 import opentelemetry_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from controlplane.reloader import snapshots_for
from controlplane.translate import names
from controlplane.translate.render import CLUSTER, LISTENER, render
from controlplane.translate.static import static_bootstrap
from policy.loader import load_policy_text
from tokenweir.envoy_launcher import validate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mesh.yaml"
TRACING = "\ntracing: {collector: 127.0.0.1:4317, sample_percent: 25}\n"


def _hcms(res: dict) -> list[hcm_pb2.HttpConnectionManager]:
    out = []
    for listener in res[LISTENER].values():
        for chain in listener.filter_chains:
            for f in chain.filters:
                if f.name == "envoy.filters.network.http_connection_manager":
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    out.append(hcm)
    return out


def test_every_listener_traces_to_the_collector_cluster() -> None:
    groups = render(load_policy_text(EXAMPLE.read_text() + TRACING, str(EXAMPLE)))
    for snap in snapshots_for(groups).values():
        snap.check()
    for node, res in groups.items():
        collector = res[CLUSTER][names.TRACING_CLUSTER]
        sa = collector.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
        assert (sa.address, sa.port_value) == ("127.0.0.1", 4317)
        assert collector.typed_extension_protocol_options  # HTTP/2 (OTLP is gRPC)
        hcms = _hcms(res)
        assert hcms
        for hcm in hcms:
            t = hcm.tracing
            assert t.random_sampling.value == 25
            assert t.provider.name == "envoy.tracers.opentelemetry"
            otel = opentelemetry_pb2.OpenTelemetryConfig()
            t.provider.typed_config.Unpack(otel)
            assert otel.grpc_service.envoy_grpc.cluster_name == names.TRACING_CLUSTER
            assert otel.service_name == node


@pytest.mark.parametrize("node", ["edge", "inventory-sidecar"])
def test_envoy_accepts_the_tracer(node: str) -> None:
    groups = render(load_policy_text(EXAMPLE.read_text() + TRACING, str(EXAMPLE)))
    ok, message = validate(static_bootstrap(groups[node], node_id=node))
    assert ok, message


def test_no_tracing_section_no_tracer_no_cluster() -> None:
    groups = render(load_policy_text(EXAMPLE.read_text(), str(EXAMPLE)))
    for res in groups.values():
        assert names.TRACING_CLUSTER not in res[CLUSTER]
        assert all(not hcm.HasField("tracing") for hcm in _hcms(res))
