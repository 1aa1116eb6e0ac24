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
    assert servicer.tracing.current is None
    resp = await servicer.ShouldRateLimit(rls.llm("acme", 100), _Context(()))
    assert resp.overall_code != OVER
    raw = await servicer.handle_bytes_traced(
        rls.llm("acme", 1, rid="r2").SerializeToString(), (("traceparent", PARENT),)
    )
    assert raw  # the h2 path while tracing is off: answered, no span, nothing kept
    assert not decider.store.state.traces


async def test_the_settlement_joins_the_trace_its_reservation_kept(policy: Any) -> None:  # noqa: F811
    """Envoy 1.40's stream-done call carries no traceparent: the reservation kept the
    request's, and the settle span is its child, timed from when the call arrived."""
    decider, _ = make(policy)
    exporter = InMemorySpanExporter()
    tracing = Tracing("unused:1", "tokenweir-ratelimit", exporter=exporter)
    servicer = RateLimitServicer(decider, tracing)
    await servicer.ShouldRateLimit(
        rls.llm("acme", 100, rid="q1"), _Context((("traceparent", PARENT),))
    )
    await servicer.ShouldRateLimit(rls.llm("acme", 1, rid="q2"), _Context(()))  # untraced
    assert list(decider.store.state.traces.values()) == [PARENT]  # kept with q1 only
    settle = rls.llm("acme", 40, rid="q1", phase="settle")
    await servicer.ShouldRateLimit(settle, _Context(()))
    await servicer.ShouldRateLimit(rls.llm("acme", 5, rid="q2", phase="settle"), _Context(()))
    await servicer.ShouldRateLimit(settle, _Context(()))  # settled already: nothing to join
    await tracing.aclose()
    reserve, settled = exporter.get_finished_spans()
    assert settled.attributes["tokenweir.phase"] == "settle"
    assert settled.attributes["tokenweir.hits"] == 40
    assert settled.context.trace_id == reserve.context.trace_id
    assert settled.parent is not None and f"{settled.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert settled.start_time is not None and settled.end_time is not None
    assert settled.start_time <= settled.end_time
    assert not decider.store.state.traces
