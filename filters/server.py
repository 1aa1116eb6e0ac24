"""The ext_proc gRPC server: one stream per HTTP request, driven through the route's chain.

The route arrives as gRPC initial metadata ``x-tokenweir-route`` that the control plane sets
per route (ExtProcPerRoute.overrides.grpc_initial_metadata): clients cannot reach it. Whatever
the plugins do, the server strips client-supplied ``x-tokenweir-*`` headers and, on
rate-limited routes, always sets tenant, model, lane and reserve so the rate-limit descriptors
are complete (a missing ``hits_addend`` value would disable the limit in Envoy).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import NoReturn, Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from filters.api import Context, openai_error
from filters.chain import Outcome
from filters.metrics import FilterMetrics
from filters.oversize import drain_body, oversize_limit, oversize_reply
from filters.plugins.usage.plugin import UsagePlugin
from filters.protocol import (
    CONTINUE_REQUEST_BODY,
    CONTINUE_RESPONSE_BODY,
    CONTINUE_RESPONSE_HEADERS,
    body_response,
    header_map,
    headers_response,
    immediate,
    trailers_response,
)
from filters.registry import RouteEntry
from filters.sse import SETTLE_KEY
from filters.tracing import end_stream_span, reply_status
from filters.usage_log import UsageLog
from policy.admission import hold_slack
from policy.phases import OVERSIZE_ROUTE_PREFIX, ROUTE_HEADER
from runtime.drain import Inflight
from runtime.grpc_health import AioHealth
from runtime.health import HealthState
from runtime.tracing import Tracing, TracingSwitch
from wire.contract import HEADER_PREFIX, LANE_HEADER, MODEL_HEADER, RESERVE_HEADER, TENANT_HEADER

__all__ = ["FilterServer", "FilterServicer"]

_log = logging.getLogger(__name__)
_INTERNAL = HEADER_PREFIX


class _Context(Protocol):
    """What :meth:`FilterServicer.Process` uses of an ext_proc stream: grpc.aio's servicer
    context, or the HTTP/2 transport's :class:`filters.h2stream.StreamContext`."""

    def invocation_metadata(
        self,
    ) -> Sequence[tuple[str, str]] | None: ...  # grpc: bytes for -bin keys

    async def read(self) -> pb.ProcessingRequest: ...  # or grpc.aio.EOF at the stream's end

    async def write(self, message: pb.ProcessingResponse) -> None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...


def _route_name(context: _Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == ROUTE_HEADER:
            return value if isinstance(value, str) else value.decode()
    return None


def _finish(out: Outcome) -> Outcome:
    """Never remove a header that is also set (Envoy's order of the two is not ours to rely on)."""
    if out.remove_headers:
        seen: set[str] = set()
        out.remove_headers = [
            h
            for h in out.remove_headers
            if h not in out.set_headers and not (h in seen or seen.add(h))  # type: ignore[func-returns-value]  # set.add returns None: the idiom marks h as seen while filtering
        ]
    return out


def _descriptor_headers(ctx: Context) -> dict[str, str]:
    return {
        TENANT_HEADER: ctx.tenant or "anonymous",
        MODEL_HEADER: ctx.model or (ctx.route.models[0] if ctx.route.models else "unknown"),
        LANE_HEADER: ctx.lane or ctx.route.lane or "interactive",
        RESERVE_HEADER: str(ctx.reserve or 0),
    }


class FilterServicer(pb_grpc.ExternalProcessorServicer):
    """Serves ``envoy.service.ext_proc.v3.ExternalProcessor/Process``."""

    def __init__(
        self,
        routes: Mapping[str, RouteEntry],
        *,
        clock: Callable[[], float],
        metrics: FilterMetrics,
        inflight: Inflight | None = None,
        message_timeout: float = 0.2,
        tracing: TracingSwitch | Tracing | None = None,
    ) -> None:
        self._routes = dict(routes)
        # current None: no span, no propagator on the hot path (it follows policy reloads)
        self.tracing = (
            tracing if isinstance(tracing, TracingSwitch) else TracingSwitch.fixed(tracing)
        )
        self._clock = clock
        self._metrics = metrics
        self.inflight = inflight if inflight is not None else Inflight()
        self._message_timeout = message_timeout

    @property
    def route_count(self) -> int:
        return len(self._routes)

    def swap(self, routes: Mapping[str, RouteEntry]) -> None:
        """Use new chains for new streams; streams in flight finish on the old ones."""
        self._routes = dict(routes)

    async def Process(  # gRPC's method name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest] | None, context: _Context
    ) -> None:
        """Read/write style (cheaper than an async generator in grpc.aio).

        While the process drains, a new stream is refused (UNAVAILABLE); streams in flight
        run to their end."""
        if not self.inflight.enter():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the filter server is draining")
        try:
            await self._process(context)
        finally:
            self.inflight.leave()

    async def _process(self, context: _Context) -> None:
        name = _route_name(context)
        entry = self._routes.get(name) if name else None
        ctx: Context | None = None
        read, write, eof = context.read, context.write, grpc.aio.EOF  # type: ignore[attr-defined]  # grpc.aio.EOF exists at run time but not in grpc's stubs
        if entry is None and name is not None:
            limit = oversize_limit(name, OVERSIZE_ROUTE_PREFIX)
            if limit is not None:
                if await drain_body(read, eof) is not None:
                    self._metrics.rejected("oversize", "too_large", 413)
                    await write(oversize_reply(limit))
                return
        tracing = self.tracing.current
        span = None if tracing is None else tracing.start(
            f"ext_proc {name}", context.invocation_metadata() or ()
        )  # fmt: skip
        status: int | None = None
        try:
            while True:
                req = await read()
                if req is eof:
                    return
                resp = await self._answer(req, entry, name, ctx, write)
                if isinstance(resp, tuple):
                    ctx, resp = resp
                if span is not None and status is None:
                    status = reply_status(resp)
                await write(resp)
                if entry is None:
                    return
        finally:
            if ctx is not None and entry is not None:
                await entry.chain.stream_end(ctx)
                self._done(entry, ctx)
            if span is not None:
                end_stream_span(span, name, ctx, status)

    def _done(self, entry: RouteEntry, ctx: Context) -> None:
        """RED per route, lane, model and tenant (docs/metrics.md)."""
        if ctx.status is not None and ctx.status >= 400:
            outcome = "rejected"
        elif ctx.metered_in_envoy:  # Envoy's usage meter reports it (filters/usage_log.py)
            return
        else:
            outcome = ctx.outcome or "no_output"
        model = ctx.model or (entry.info.models[0] if entry.info.models else None)
        lane = ctx.lane or entry.info.lane
        seconds = max(0.0, self._clock() - ctx.started)
        self._metrics.request_done(entry.info.name, lane, model, ctx.tenant, outcome, seconds)

    async def _answer(
        self,
        req: pb.ProcessingRequest,
        entry: RouteEntry | None,
        name: str | None,
        ctx: Context | None,
        write: Callable[[pb.ProcessingResponse], Awaitable[None]] | None = None,
    ) -> pb.ProcessingResponse | tuple[Context, pb.ProcessingResponse]:
        which = req.WhichOneof("request")
        if which == "request_headers":
            if entry is None:
                self._metrics.unknown_routes.inc()
                return immediate(
                    openai_error(
                        503,
                        f"the filter server has no route {name!r} (policy reloading?)",
                        error_type="server_error",
                        headers={"retry-after": "1"},
                        details="tokenweir_unknown_route",
                    )
                )
            ctx = Context(route=entry.info, started=self._clock())
            if write is not None:
                ctx.hold = _holder(write, hold_slack(self._message_timeout))
            try:
                return ctx, await self._request_headers(entry, ctx, req.request_headers)
            except BaseException:  # cancelled (Envoy reset the stream): plugins free what they hold
                await entry.chain.stream_end(ctx)
                raise
        if entry is None or ctx is None:
            return _continue(which)
        if which == "response_body":
            if not entry.chain.needs("response_chunk"):
                return CONTINUE_RESPONSE_BODY
            b = req.response_body
            out = await entry.chain.response_chunk(ctx, b.body, b.end_of_stream)
            return CONTINUE_RESPONSE_BODY if out.empty else body_response("response_body", out)
        if which == "request_body":
            return await self._request_body(entry, ctx, req.request_body)
        if which == "response_headers":
            if not entry.chain.needs("response_headers"):
                return CONTINUE_RESPONSE_HEADERS
            headers = header_map(req.response_headers.headers)
            out = await entry.chain.response_headers(ctx, headers)
            return headers_response("response_headers", _finish(out))
        return _continue(which)

    async def _request_headers(
        self, entry: RouteEntry, ctx: Context, msg: pb.HttpHeaders
    ) -> pb.ProcessingResponse:
        self._metrics.stream_started(entry.info.name)
        headers = header_map(msg.headers)
        strip = [h for h in headers if h.startswith(_INTERNAL)]
        for h in strip:
            del headers[h]
        ctx.request_headers = headers
        ctx.request_id = headers.get("x-request-id", "")
        ctx.method = headers.get(":method", "")
        ctx.path = headers.get(":path", "")
        out = await entry.chain.request_headers(ctx, dict(headers), msg.end_of_stream)
        if out.reply is not None:
            ctx.status = out.reply.status
        out.remove_headers[:0] = strip
        if strip and out.reply is None:
            # Envoy picked the route on the client's headers: pick again without them (a
            # client's x-tokenweir-degrade or -lane must not choose a route)
            out.clear_route_cache = True
        if ctx.tenant is not None and out.reply is None:  # for the access log (never a header)
            out.metadata.setdefault("tenant", ctx.tenant)
            out.metadata.setdefault("tier", ctx.tier or "")
            out.metadata.setdefault("lane", ctx.lane or ctx.route.lane or "interactive")
        if entry.info.rate_limited and out.reply is None:
            for k, v in _descriptor_headers(ctx).items():
                out.set_headers.setdefault(k, v)
            out.clear_route_cache = True
            # the stream-done settlement always has a value: nothing produced until the usage
            # plugin sees output (an upstream error, or a client gone before any, settles 0);
            # without one Envoy skips the call, logs "Invalid hits_addend" and the whole
            # reservation stays charged
            out.metadata.setdefault(SETTLE_KEY, 0)
        return headers_response("request_headers", _finish(out))

    async def _request_body(
        self, entry: RouteEntry, ctx: Context, msg: pb.HttpBody
    ) -> pb.ProcessingResponse:
        info = entry.info
        if not entry.chain.needs("request_body") and not (
            info.rate_limited or info.metered_in_envoy
        ):
            return CONTINUE_REQUEST_BODY
        out = await entry.chain.request_body(ctx, msg.body)
        if out.reply is not None:
            ctx.status = out.reply.status
        elif info.metered_in_envoy:
            meter = _usage_plugin(entry)
            if meter is not None:
                out.metadata.update(meter.envoy_inputs(ctx))
                ctx.metered_in_envoy = True
        if entry.info.rate_limited and out.reply is None:
            # tenant and lane were set with the headers; the body decides model and reserve
            d = _descriptor_headers(ctx)
            out.set_headers.setdefault(MODEL_HEADER, d[MODEL_HEADER])
            out.set_headers.setdefault(RESERVE_HEADER, d[RESERVE_HEADER])
            out.clear_route_cache = True
            out.metadata.setdefault("model", d[MODEL_HEADER])
            out.metadata.setdefault("reserve", ctx.reserve or 0)
            if not _meters_usage(entry):  # nobody will count: the worst case stays charged
                out.metadata.setdefault(SETTLE_KEY, ctx.reserve or 0)
        return body_response("request_body", _finish(out))


def _holder(
    write: Callable[[pb.ProcessingResponse], Awaitable[None]], margin: float
) -> Callable[[float], Awaitable[None]]:
    """``ctx.hold``: tell Envoy to wait ``seconds`` (plus ``margin``, the answer's slack) for
    the answer to the current phase; Envoy ignores more than the filter's
    ``max_message_timeout`` (the control plane sets it from the same slack)."""

    async def hold(seconds: float) -> None:
        resp = pb.ProcessingResponse()
        resp.override_message_timeout.FromNanoseconds(int((seconds + margin) * 1e9))
        await write(resp)

    return hold


def _meters_usage(entry: RouteEntry) -> bool:
    return _usage_plugin(entry) is not None


def _usage_plugin(entry: RouteEntry) -> UsagePlugin | None:
    return next((p for p in entry.chain.plugins if isinstance(p, UsagePlugin)), None)


def _continue(which: str | None) -> pb.ProcessingResponse:
    if which == "request_body":
        return CONTINUE_REQUEST_BODY
    if which == "response_headers":
        return CONTINUE_RESPONSE_HEADERS
    if which == "response_body":
        return CONTINUE_RESPONSE_BODY
    if which in ("request_trailers", "response_trailers"):
        return trailers_response(which)
    if which == "request_headers":
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    return pb.ProcessingResponse()


class FilterServer:
    """A grpc.aio server hosting :class:`FilterServicer` and ``grpc.health.v1.Health``.

    ``drain(timeout)`` reports NOT_SERVING, refuses new streams and waits for those in flight
    (health checks keep being answered meanwhile); ``aclose()`` stops the server."""

    def __init__(
        self,
        servicer: FilterServicer,
        host: str,
        port: int,
        *,
        health: HealthState | None = None,
        usage_log: UsageLog | None = None,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.servicer = servicer
        self.health = AioHealth(health if health is not None else HealthState())
        options: list[tuple[str, int]] = [
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", 80 * 1024 * 1024),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        self._server = grpc.aio.server(options=options)
        pb_grpc.add_ExternalProcessorServicer_to_server(servicer, self._server)
        if usage_log is not None:  # Envoy's gRPC access log: filters/usage_log.py
            self._server.add_generic_rpc_handlers((_access_log_handler(usage_log),))
        self.health.add_to(self._server)
        if credentials is not None:  # mTLS (runtime.tls_server.RenewingTls.grpc_credentials)
            self.port = self._server.add_secure_port(f"{host}:{port}", credentials)
        else:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")

    async def start(self) -> None:
        await self.health.sync()
        await self._server.start()

    async def drain(self, timeout: float) -> int:
        """NOT_SERVING, then wait for the streams in flight; returns how many were left."""
        self.health.state.shutdown()
        await self.health.sync()
        return await self.servicer.inflight.drain(timeout)

    async def aclose(self, grace: float = 1.0) -> None:
        await self._server.stop(grace)


def _access_log_handler(usage_log: UsageLog) -> grpc.GenericRpcHandler:
    async def stream(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        await usage_log.consume(requests)
        return b""

    return grpc.method_handlers_generic_handler(
        "envoy.service.accesslog.v3.AccessLogService",
        {"StreamAccessLogs": grpc.stream_unary_rpc_method_handler(stream)},
    )
