"""The rate-limit service's span: one per ``ShouldRateLimit`` call, a child of the span Envoy's
tracer made for the call (``traceparent`` in the gRPC metadata).

Attributes: the descriptors' tenant, model (``gen_ai.request.model``), lane and phase, the
tokens asked for (``tokenweir.hits``: a reservation, or the real usage when settling), and
``tokenweir.decision`` (``ok`` / ``over_limit``, with the quota and the Retry-After given).
"""

from __future__ import annotations

from envoy.service.ratelimit.v3 import rls_pb2
from opentelemetry.trace import Span, Status, StatusCode

from runtime import tracing as t

__all__ = ["end_call_span"]

_KEYS = {"tenant": t.TENANT, "model": t.REQUEST_MODEL, "lane": t.LANE, "phase": "tokenweir.phase"}


def end_call_span(
    span: Span, request: rls_pb2.RateLimitRequest, response: rls_pb2.RateLimitResponse | None
) -> None:
    """``response`` None: the call ended without an answer (cancelled when Envoy's timeout
    fired first; Envoy then applied its failure mode)."""
    attrs: dict[str, str | int] = {}
    hits = 0
    for d in request.descriptors:
        for e in d.entries:
            key = _KEYS.get(e.key)
            if key is not None:
                attrs.setdefault(key, e.value)
        hits += d.hits_addend.value if d.HasField("hits_addend") else 0
    attrs["tokenweir.hits"] = hits or request.hits_addend
    if response is None:
        attrs[t.DECISION] = "cancelled"
        span.set_attributes(attrs)
        span.set_status(Status(StatusCode.ERROR, "no answer (the caller gave up)"))
        span.end()
        return
    over = response.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    attrs[t.DECISION] = "over_limit" if over else "ok"
    for h in response.response_headers_to_add:
        if h.key == "retry-after":
            attrs["tokenweir.retry_after_s"] = int(h.value) if h.value.isdigit() else h.value
        elif h.key == "x-ratelimit-quota":
            attrs["tokenweir.quota"] = h.value
    span.set_attributes(attrs)
    span.end()
