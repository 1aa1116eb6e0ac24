"""The gateway metrics of requests Envoy's Lua usage meter covered, from Envoy's gRPC access log.

On a route the meter covers (``RouteInfo.metered_in_envoy``) the response body no longer passes
through the filter server, so the metrics it used to record per chunk arrive once per request,
batched: Envoy's ``envoy.access_loggers.http_grpc`` streams ``StreamAccessLogs`` to this server
(``controlplane/translate/usage_meter.py``), each entry carrying the request's dynamic metadata
(namespace ``tokenweir``): what the filter server set at the request (tenant, lane, model, route,
prompt estimate) and what the meter set at the response (``timing`` = chunks, first and last
chunk times, the chunk-gap bucket counts; ``outcome``; the reported usage). Abandoned streams are
logged too (Envoy logs every request). :func:`record` turns one entry into the same metric
updates the Python usage plugin makes (docs/metrics.md). With tracing on, an entry whose request
carried a ``traceparent`` (logged with it) also becomes the request's ``usage`` span: the
GenAI token attributes the filter server's own span can no longer know when it ends (its
ext_proc stream closes before the response does), from the request's start to its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from opentelemetry.util.types import AttributeValue

from filters.metrics import FilterMetrics
from policy.model import Policy
from quota.cost import cost_usd, price_factor
from runtime import tracing as t
from runtime.tracing import TracingSwitch
from wire.contract import METADATA_NAMESPACE

__all__ = ["ALS_PATH", "UsageLog", "record"]

ALS_PATH = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
# one field of an entry's ``tokenweir`` metadata (a protobuf Struct value: numbers are floats)
Logged: TypeAlias = float | str | bool | None
LoggedFields: TypeAlias = dict[str, Logged]


def _text(md: LoggedFields, key: str) -> str | None:
    """A string field (tenant, model, lane), or None where it is absent or not a string."""
    value = md.get(key)
    return value if isinstance(value, str) else None


def _count(md: LoggedFields, key: str) -> int:
    """A token count (a number; 0 where it is absent)."""
    value = md.get(key)
    return int(value) if isinstance(value, int | float) else 0


def _value(v: struct_pb2.Value) -> Logged:
    kind = v.WhichOneof("kind")
    if kind == "number_value":
        return v.number_value
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    return None


_KEYS = ("meter", "tenant", "model", "lane", "route", "pool", "outcome", "timing", "t0_us",
         "prompt", "prompt_tokens", "completion_tokens", "cached_tokens",
         # the endpoint picker's prediction (filters/plugins/picker/regret.py)
         "replica", "predicted_cached_tokens", "predicted_ttft_ms", "work_tokens", "sent_us",
         "running")  # fmt: skip


def _fields(entry: accesslog_pb2.HTTPAccessLogEntry) -> LoggedFields:
    st = entry.common_properties.metadata.filter_metadata.get(METADATA_NAMESPACE)
    if st is None:
        return {}
    fields = st.fields
    return {k: _value(fields[k]) for k in _KEYS if k in fields}


def _seconds(d: duration_pb2.Duration) -> float:
    return float(d.seconds) + d.nanos / 1e9


def record(
    metrics: FilterMetrics,
    policy: Policy,
    entry: accesslog_pb2.HTTPAccessLogEntry,
    md: LoggedFields | None = None,
) -> None:
    """The metrics of one finished (or abandoned) metered request (``md``: the entry's
    ``tokenweir`` fields, when the caller already read them)."""
    md = _fields(entry) if md is None else md
    if not md.get("meter"):
        return
    tenant, model, lane = _text(md, "tenant"), _text(md, "model"), _text(md, "lane")
    common = entry.common_properties
    duration = common.duration if common.HasField("duration") else None
    if duration is None and common.HasField("time_to_last_downstream_tx_byte"):
        duration = common.time_to_last_downstream_tx_byte
    route = str(md.get("route") or common.route_name)
    outcome = str(md.get("outcome") or "no_output")
    metrics.request_done(
        route, lane, model, tenant, outcome, _seconds(duration) if duration is not None else 0.0
    )
    stream = str(md.get("timing") or "")
    first = last = 0.0
    chunks = 0
    if stream:
        parts = [int(x) for x in stream.split(",")]
        chunks, first_us, last_us, gap_sum = parts[0], parts[1], parts[2], parts[3]
        first, last = first_us / 1e6, last_us / 1e6
        ttft, tbt = metrics.stream_timers(tenant, model, lane)
        t0 = md.get("t0_us")
        if chunks > 0 and isinstance(t0, float):
            ttft.observe(max(0.0, first - t0 / 1e6))
        if chunks > 1:
            metrics.add_observations(tbt, parts[4:], gap_sum / 1e6)
    completion = md.get("completion_tokens")
    if not isinstance(completion, float):
        return
    p, c, k = _count(md, "prompt_tokens"), int(completion), _count(md, "cached_tokens")
    prompt_c, completion_c, cached_c = metrics.token_counters(tenant, model)
    prompt_c.inc(p)
    completion_c.inc(c)
    cached_c.inc(k)
    metrics.spent(tenant, model, cost_usd(policy, model, p, c, k, price_factor(policy, route)))
    t_label, m_label = metrics.tenant_label(tenant), metrics.model_label(model)
    if chunks > 1 and last > first and c > 1:
        metrics.child(metrics.tokens_per_second, t_label, m_label).observe((c - 1) / (last - first))
    estimate = md.get("prompt")
    if isinstance(estimate, float) and estimate > 0 and p:
        metrics.child(metrics.estimate_ratio, m_label).observe(estimate / p)


def _ns(ts: timestamp_pb2.Timestamp | duration_pb2.Duration) -> int:
    return int(ts.seconds) * 1_000_000_000 + int(ts.nanos)


def usage_span(
    switch: TracingSwitch, entry: accesslog_pb2.HTTPAccessLogEntry, md: LoggedFields
) -> None:
    """The request's ``usage`` span (child of its ``traceparent``), when tracing is on and the
    request was traced; nothing otherwise. ``md``: the entry's ``tokenweir`` fields."""
    tracing = switch.current
    headers = entry.request.request_headers
    if tracing is None or "traceparent" not in headers:
        return
    common = entry.common_properties
    start = _ns(common.start_time) if common.HasField("start_time") else None
    attrs: dict[str, AttributeValue] = {}
    for key, name in (("model", t.REQUEST_MODEL), ("tenant", t.TENANT), ("lane", t.LANE)):
        value = _text(md, key)
        if value is not None:
            attrs[name] = value
    completion = md.get("completion_tokens")
    if isinstance(completion, float):
        attrs[t.INPUT_TOKENS] = _count(md, "prompt_tokens")
        attrs[t.OUTPUT_TOKENS] = int(completion)
        attrs[t.CACHED_TOKENS] = _count(md, "cached_tokens")
    attrs["tokenweir.outcome"] = str(md.get("outcome") or "no_output")
    span = tracing.start("usage", dict(headers), attrs, start_time_ns=start)
    if span is None:
        return
    end = None
    if start is not None and common.HasField("duration"):
        end = start + _ns(common.duration)
    span.end(end_time=end)


class UsageLog:
    """The ``StreamAccessLogs`` handler: a client stream of batches, answered at its end."""

    def __init__(
        self,
        metrics: FilterMetrics,
        policy: Callable[[], Policy],
        tracing: TracingSwitch | None = None,
        on_metered: Callable[[LoggedFields], None] | None = None,
    ) -> None:
        """``on_metered(fields)``: each request Envoy's usage meter covered, with its
        ``tokenweir`` fields (the endpoint pickers' predicted-vs-actual, the learned output
        lengths, the tenants' token shares of their lanes: FilterApp._metered)."""
        self.metrics = metrics
        self.policy = policy
        self.tracing = tracing
        self.on_metered = on_metered
        self.entries = 0

    def handle(self, message: bytes) -> None:
        msg = als_pb2.StreamAccessLogsMessage.FromString(message)
        policy = self.policy()
        for entry in msg.http_logs.log_entry:
            self.entries += 1
            md = _fields(entry)
            record(self.metrics, policy, entry, md)
            if self.on_metered is not None and md.get("meter"):
                self.on_metered(md)
            if self.tracing is not None:
                usage_span(self.tracing, entry, md)

    async def consume(self, messages: AsyncIterator[bytes]) -> None:
        async for m in messages:
            self.handle(m)
