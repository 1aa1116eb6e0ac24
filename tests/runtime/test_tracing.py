"""runtime.tracing: spans join the caller's trace from ``traceparent``; a call without one starts
nothing; a process whose policy has no ``tracing`` never imports the trace SDK or an exporter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.tracing import Tracing

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


async def test_span_is_a_child_of_the_callers_traceparent() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing("unused:1", "svc", exporter=exporter, flush_interval=0.01)
    meta = (("x-tokenweir-route", "llm"), ("traceparent", f"00-{TRACE_ID}-{PARENT}-01"))
    span = tracing.start("ext_proc llm", meta, {"gen_ai.request.model": "m1"})
    assert span is not None
    span.end()
    assert tracing.start("no parent", (("x-other", "1"),)) is None  # the gateway decides
    assert tracing.flush()
    (got,) = exporter.get_finished_spans()
    assert f"{got.context.trace_id:032x}" == TRACE_ID
    assert got.parent is not None and f"{got.parent.span_id:016x}" == PARENT
    assert got.resource.attributes["service.name"] == "svc"
    assert got.attributes["gen_ai.request.model"] == "m1"
    await tracing.aclose()


async def test_an_unsampled_parent_records_nothing() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing("unused:1", "svc", exporter=exporter)
    span = tracing.start("x", {"traceparent": f"00-{TRACE_ID}-{PARENT}-00"})
    assert span is not None and not span.is_recording()
    span.end()
    await tracing.aclose()
    assert exporter.get_finished_spans() == ()


def test_services_without_tracing_never_load_the_trace_sdk() -> None:
    # (redis-py imports opentelemetry.sdk.metrics for its own observability: not ours)
    code = (
        "import sys, filters.app, filters.server, ratelimit_service.server, "
        "backends.emulator.server, controlplane.app\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
