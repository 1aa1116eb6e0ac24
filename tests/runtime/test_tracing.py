"""runtime.tracing: spans join the caller's trace from ``traceparent``; a call without one starts
nothing; a process whose policy has no ``tracing`` never imports the trace SDK or an exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.tracing import Tracing, TracingSwitch

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


async def test_the_switch_follows_the_section_on_off_and_to_another_collector() -> None:
    """A reload turns tracing on (a tracer built off the loop), changes it (the old one flushed
    at once, shut down later: a span it started still ends and exports) and turns it off."""
    from policy.common import Address
    from policy.tracing import Tracing as Section

    exporters: list[InMemorySpanExporter] = []

    def factory(section: Section | None, service: str) -> Tracing | None:
        if section is None:
            return None
        exporters.append(InMemorySpanExporter())
        return Tracing(str(section.collector), service, exporter=exporters[-1])

    switch = TracingSwitch("svc", factory=factory, retire_after=0.2)
    parent = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}
    one, two = Section(Address("127.0.0.1", 4317)), Section(Address("127.0.0.1", 4318), 50.0)
    await switch.update(None)
    assert switch.current is None and switch.changes == 0
    switch.apply(one)
    switch.apply(one)  # the same section again: nothing to do
    for _ in range(200):
        if switch.current is not None:
            break
        await asyncio.sleep(0.01)
    first = switch.current
    assert first is not None and switch.changes == 1
    open_span = first.start("in flight", parent)
    assert open_span is not None
    await switch.update(two)
    assert switch.current is not first and switch.section == two and switch.changes == 2
    open_span.end()  # after the swap, before the old tracer retires
    await switch.update(None)
    assert switch.current is None and switch.changes == 3
    await asyncio.sleep(0.4)  # both retired: flushed and shut down
    assert [s.name for s in exporters[0].get_finished_spans()] == ["in flight"]
    assert len(exporters) == 2
    await switch.aclose()


async def test_the_last_section_asked_for_wins() -> None:
    from policy.common import Address
    from policy.tracing import Tracing as Section

    built: list[str] = []

    def factory(section: Section | None, service: str) -> Tracing | None:
        if section is None:
            return None
        built.append(str(section.collector))
        return Tracing(str(section.collector), service, exporter=InMemorySpanExporter())

    switch = TracingSwitch("svc", factory=factory)
    for port in (1, 2, 3):
        switch.apply(Section(Address("127.0.0.1", port)))
    switch.apply(None)
    await asyncio.sleep(0.3)
    assert switch.current is None and switch.section is None
    await switch.aclose()
    assert built == []  # reloads that came in before the change ran: none was ever built
