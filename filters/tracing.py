"""The filter server's span: one per ext_proc stream (one HTTP request), a child of the span
Envoy's tracer made for the ext_proc call (its ``traceparent`` is in the gRPC metadata).

Its attributes are set once, when the stream ends (GenAI semantic conventions plus
tokenweir's decision): the request's model and token counts, tenant, tier, lane, route, and
``tokenweir.decision`` (``admitted``, or ``rejected`` with ``http.response.status_code``).
"""

from __future__ import annotations

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from opentelemetry.trace import Span, Status, StatusCode  # the API only (light)
from opentelemetry.util.types import AttributeValue

from filters.api import Context
from runtime import tracing as t

__all__ = ["end_stream_span", "reply_status"]


def reply_status(response: pb.ProcessingResponse) -> int | None:
    """The HTTP status of an immediate reply, or None for any other ext_proc answer."""
    if response.WhichOneof("response") != "immediate_response":
        return None
    return int(response.immediate_response.status.code)


def end_stream_span(span: Span, route: str | None, ctx: Context | None, status: int | None) -> None:
    attrs: dict[str, AttributeValue] = {
        t.ROUTE: route or "",
        t.DECISION: "admitted" if status is None else "rejected",
    }
    if status is not None:
        attrs["http.response.status_code"] = status
    elif ctx is not None and ctx.status is not None:  # what the client got (a later filter's
        attrs["http.response.status_code"] = ctx.status  # 429 too, when responses are seen)
    if ctx is not None:
        attrs[t.OPERATION] = "chat" if ctx.path.startswith("/v1/chat") else "text_completion"
        for key, value in (
            (t.TENANT, ctx.tenant),
            (t.TIER, ctx.tier),
            (t.LANE, ctx.lane),
            (t.REQUEST_MODEL, ctx.model),
            (t.MAX_TOKENS, ctx.max_tokens),
            ("tokenweir.reserve_tokens", ctx.reserve),
            ("http.request.id", ctx.request_id or None),
        ):
            if value is not None:
                attrs[key] = value
        if ctx.usage is not None:
            attrs[t.INPUT_TOKENS] = ctx.usage.prompt_tokens
            attrs[t.OUTPUT_TOKENS] = ctx.usage.completion_tokens
            attrs[t.CACHED_TOKENS] = ctx.usage.cached_tokens
    span.set_attributes(attrs)
    if status is not None and status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
