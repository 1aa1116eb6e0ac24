"""OpenTelemetry tracing of the Python services, on when the policy has a ``tracing`` section.

One :class:`Tracing` per process: its own ``TracerProvider`` (no global state) whose batch
processor exports OTLP/gRPC to the policy's collector every ``flush_interval``; ``aclose()``
flushes and stops it. The parent of every span comes from the ``traceparent`` (W3C) that Envoy's
tracer put in the call's metadata or the request's headers, so a request's spans across the
gateway, the filter server, the rate-limit service and the backend form one trace.

Without the section :func:`tracing_for` returns None and the services create no span, call no
propagator and start no exporter: tracing costs one ``is None`` test per request.

Span attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``); tokenweir's
own decisions carry ``tokenweir.*`` names (tenant, tier, lane, route, decision).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from controlplane.policy import Policy
from controlplane.policy.tracing import Tracing as TracingPolicy

if TYPE_CHECKING:  # the SDK is imported only by a process that traces
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "CACHED_TOKENS",
    "DECISION",
    "INPUT_TOKENS",
    "LANE",
    "MAX_TOKENS",
    "OPERATION",
    "OUTPUT_TOKENS",
    "REQUEST_MODEL",
    "ROUTE",
    "TENANT",
    "TIER",
    "Tracing",
    "tracing_for",
]

# GenAI semantic conventions
OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
MAX_TOKENS = "gen_ai.request.max_tokens"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHED_TOKENS = "gen_ai.usage.cache_read.input_tokens"
# tokenweir's own
TENANT = "tokenweir.tenant"
TIER = "tokenweir.tier"
LANE = "tokenweir.lane"
ROUTE = "tokenweir.route"
DECISION = "tokenweir.decision"


class Tracing:
    """The tracer of one process (``service`` becomes the spans' ``service.name``)."""

    def __init__(
        self,
        endpoint: str,
        service: str,
        *,
        sample_percent: float = 100.0,
        flush_interval: float = 1.0,
        exporter: SpanExporter | None = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service}),
            sampler=ParentBased(TraceIdRatioBased(sample_percent / 100.0)),
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=max(10, int(flush_interval * 1000)))
        )
        self.tracer: Tracer = self.provider.get_tracer("tokenweir")
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER

    def parent(self, headers: Iterable[tuple[str, str]] | Mapping[str, str]) -> Context | None:
        """The remote parent named by ``traceparent`` (and ``tracestate``) in ``headers``, or
        None when the caller sent none."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        carrier = {k: v for k, v in items if k in ("traceparent", "tracestate")}
        if "traceparent" not in carrier:
            return None
        return self._propagator.extract(carrier)

    def start(
        self,
        name: str,
        headers: Iterable[tuple[str, str]] | Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
    ) -> Span | None:
        """A server span whose parent is the caller's (from ``headers``); the caller ends it.

        None when the call carries no ``traceparent``: the gateway decides what is traced (a
        call outside any traced request, e.g. Envoy's fire-and-forget stream-done rate-limit
        call or a health probe, starts no trace of its own)."""
        parent = self.parent(headers)
        if parent is None:
            return None
        return self.tracer.start_span(
            name, context=parent, kind=self._server, attributes=attributes
        )

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    async def aclose(self) -> None:
        """Export what is left and stop the exporter thread."""
        await asyncio.to_thread(self.provider.shutdown)


def tracing_for(policy: Policy, service: str) -> Tracing | None:
    """The process's tracer when the policy asks for traces, else None."""
    t: TracingPolicy | None = policy.tracing
    if t is None:
        return None
    return Tracing(
        f"{t.collector.host}:{t.collector.port}",
        service,
        sample_percent=t.sample_percent,
        flush_interval=t.flush_interval,
    )
