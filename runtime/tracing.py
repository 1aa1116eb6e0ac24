"""OpenTelemetry tracing of the Python services, on when the policy has a ``tracing`` section.

One :class:`Tracing` per process: its own ``TracerProvider`` (no global state) whose batch
processor exports OTLP/gRPC to the policy's collector every ``flush_interval``; ``aclose()``
flushes and stops it. The parent of every span comes from the ``traceparent`` (W3C) that Envoy's
tracer put in the call's metadata or the request's headers, so a request's spans across the
gateway, the filter server, the rate-limit service and the backend form one trace.

Without the section the services' :class:`TracingSwitch` holds no tracer: they create no span,
call no propagator and start no exporter, and tracing costs one ``is None`` test per request.

:class:`TracingSwitch` follows the section across live policy reloads (on, off, another
collector, another sampling rate): the services read ``switch.current`` once per call; a new
tracer is built in a thread and swapped in whole, and the one it replaces is flushed at once
and shut down after ``retire_after`` seconds (spans already started on it end and export
there), all off the event loop.

Span attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``); tokenweir's
own decisions carry ``tokenweir.*`` names (tenant, tier, lane, route, decision).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the SDK is imported only by a process that traces
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

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
    "TracingSwitch",
]

log = logging.getLogger("tokenweir.tracing")

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
        attributes: Mapping[str, AttributeValue] | None = None,
        start_time_ns: int | None = None,
    ) -> Span | None:
        """A server span whose parent is the caller's (from ``headers``); the caller ends it.

        None when the call carries no ``traceparent``: the gateway decides what is traced (a
        call outside any traced request, e.g. a health probe, starts no trace of its own).
        ``start_time_ns``: when the work began, for a span whose parent is known only after
        (the rate-limit service's settlement, parented by what its reservation kept)."""
        parent = self.parent(headers)
        if parent is None:
            return None
        return self.tracer.start_span(
            name, context=parent, kind=self._server, attributes=attributes,
            start_time=start_time_ns,
        )  # fmt: skip

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    async def aclose(self) -> None:
        """Export what is left and stop the exporter thread."""
        await asyncio.to_thread(self.provider.shutdown)


class _Address(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


class TracingPolicy(Protocol):
    """What a tracer is built from: the policy's ``tracing`` section (policy/tracing.py),
    named by shape so the runtime imports no policy."""

    @property
    def collector(self) -> _Address: ...
    @property
    def sample_percent(self) -> float: ...
    @property
    def flush_interval(self) -> float: ...


def _build(t: TracingPolicy | None, service: str) -> Tracing | None:
    """The tracer a ``tracing`` section asks for (None: off)."""
    if t is None:
        return None
    return Tracing(
        f"{t.collector.host}:{t.collector.port}",
        service,
        sample_percent=t.sample_percent,
        flush_interval=t.flush_interval,
    )


Factory = Callable[[TracingPolicy | None, str], "Tracing | None"]


class TracingSwitch:
    """The process's tracer, following the policy's ``tracing`` section across reloads.

    ``current`` is None while tracing is off (no span, no propagator, no exporter). ``apply``
    (from a reload, on the loop, never blocking) starts the change in a task; ``await
    update(section)`` does it and returns when the new tracer is in place; ``aclose()``
    shuts every tracer down. ``factory`` builds a tracer (tests give an in-memory exporter).
    """

    def __init__(
        self, service: str, *, factory: Factory = _build, retire_after: float = 30.0
    ) -> None:
        self.service = service
        self.current: Tracing | None = None
        self.section: TracingPolicy | None = None  # what ``current`` was built from
        self.changes = 0
        self._factory = factory
        self._retire_after = retire_after
        self._wanted: TracingPolicy | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._retired: set[Tracing] = set()

    @classmethod
    def fixed(cls, tracing: Tracing | None, service: str = "") -> TracingSwitch:
        """A switch holding ``tracing`` (a servicer built without reloads, as in tests)."""
        switch = cls(service)
        switch.current = tracing
        return switch

    def apply(self, section: TracingPolicy | None) -> None:
        if section == self._wanted:
            return
        self._wanted = section
        self._spawn(self._change(section), "tracing-switch")

    async def update(self, section: TracingPolicy | None) -> None:
        self._wanted = section
        await self._change(section)

    async def _change(self, section: TracingPolicy | None) -> None:
        async with self._lock:  # one change at a time, the last one asked for wins
            if section != self._wanted or section == self.section:
                return
            new = await asyncio.to_thread(self._factory, section, self.service)
            if section != self._wanted:  # asked for something else meanwhile
                if new is not None:
                    await new.aclose()
                return
            old, self.current, self.section = self.current, new, section
            self.changes += 1
            log.info("tracing %s", "off" if section is None else f"to {section.collector}")
        if old is not None:
            self._retired.add(old)
            self._spawn(self._retire(old), "tracing-retire")

    async def _retire(self, old: Tracing) -> None:
        try:
            await asyncio.to_thread(old.flush)
            await asyncio.sleep(self._retire_after)
        finally:
            if old in self._retired:
                self._retired.discard(old)
                await old.aclose()

    def _spawn(self, work: Coroutine[object, None, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("tracing change failed: %s: %s", type(exc).__name__, exc)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for old in list(self._retired):
            self._retired.discard(old)
            await old.aclose()
        current, self.current, self.section = self.current, None, None
        if current is not None:
            await current.aclose()
