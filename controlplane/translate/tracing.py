"""Envoy's OpenTelemetry tracer on every HTTP connection manager when the policy has
``tracing`` (pure). Spans go over OTLP/gRPC to the collector cluster; Envoy starts the trace
(sampled at ``sample_percent``) and injects ``traceparent`` into its ext_proc and rate-limit
gRPC calls and into the upstream request, so every hop joins the same trace.
"""

from __future__ import annotations

from envoy.config.core.v3 import grpc_service_pb2
from envoy.config.trace.v3 import http_tracer_pb2, opentelemetry_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.v3 import percent_pb2

from controlplane.translate import names
from controlplane.translate.protos import any_of
from policy.tracing import Tracing

__all__ = ["hcm_tracing"]


def hcm_tracing(tracing: Tracing, service_name: str) -> hcm_pb2.HttpConnectionManager.Tracing:
    otel = opentelemetry_pb2.OpenTelemetryConfig(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=names.TRACING_CLUSTER)
        ),
        service_name=service_name,
    )
    return hcm_pb2.HttpConnectionManager.Tracing(
        random_sampling=percent_pb2.Percent(value=tracing.sample_percent),
        provider=http_tracer_pb2.Tracing.Http(
            name="envoy.tracers.opentelemetry", typed_config=any_of(otel)
        ),
        spawn_upstream_span=_true(),
    )


def _true():  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from google.protobuf import wrappers_pb2

    return wrappers_pb2.BoolValue(value=True)
