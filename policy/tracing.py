"""``tracing``: OpenTelemetry traces of every request, exported over OTLP/gRPC (docs/tracing.md).

Envoy (its OpenTelemetry tracer, started at the gateway) and the Python services (filter server,
rate-limit service, emulator) export spans to one collector; ``traceparent`` joins them into one
trace per request. Without this section nothing is traced and nothing is exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from policy.common import Address, Percent
from policy.decode import Duration

__all__ = ["Tracing"]


@dataclass(frozen=True)
class Tracing:
    collector: Address  # an OTLP/gRPC receiver (an OpenTelemetry Collector, Jaeger, Tempo …)
    sample_percent: Percent = 100.0  # of requests the gateway starts a trace for
    flush_interval: Annotated[float, Duration(0.01, 60)] = 1.0  # Python services' export period
