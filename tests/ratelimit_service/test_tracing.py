"""The rate-limit service's spans (grpc and h2 paths): a child of the traceparent Envoy sent,
with the tenant, model, lane, tokens asked and the decision (Retry-After on a denial); a call
without a traceparent, or a servicer without tracing, makes no span."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ratelimit_service.server import RateLimitServicer
from runtime.tracing import Tracing
from tests.ratelimit_service import rls
from tests.ratelimit_service.test_decider import OVER, make, policy  # noqa: F401

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


async def test_grpc_and_h2_calls_make_child_spans_with_the_decision(policy: Any) -> None:  # noqa: F811
    decider, _ = make(policy)
    exporter = InMemorySpanExporter()
    tracing = Tracing("unused:1", "tokenweir-ratelimit", exporter=exporter)
    servicer = RateLimitServicer(decider, tracing)
    ok = await servicer.ShouldRateLimit(rls.llm("acme", 100), _Context((("traceparent", PARENT),)))
    assert ok.overall_code != OVER
    raw = await servicer.handle_bytes_traced(
        rls.llm("acme", 999_999).SerializeToString(), (("traceparent", PARENT),)
    )
    assert raw
    await servicer.ShouldRateLimit(rls.llm("acme", 1), _Context(()))  # no parent: no span
    await tracing.aclose()
    first, second = exporter.get_finished_spans()
    assert first.parent is not None and f"{first.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert first.attributes["tokenweir.tenant"] == "acme"
    assert first.attributes["gen_ai.request.model"] == "big"
    assert first.attributes["tokenweir.hits"] == 100
    assert first.attributes["tokenweir.lane"] == "interactive"
    assert first.attributes["tokenweir.decision"] == "ok"
    assert second.attributes["tokenweir.decision"] == "over_limit"
    assert second.attributes["tokenweir.quota"]  # which quota denied it


async def test_without_tracing_no_span_is_made(policy: Any) -> None:  # noqa: F811
    decider, _ = make(policy)
    servicer = RateLimitServicer(decider)
    assert servicer.tracing is None
    resp = await servicer.ShouldRateLimit(rls.llm("acme", 100), _Context(()))
    assert resp.overall_code != OVER
