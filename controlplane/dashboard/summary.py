"""Pure arithmetic behind the dashboard: metric texts → :class:`Totals` → chart :class:`Point`.

:func:`totals_of` sums the counters and histograms the dashboard shows over every scraped
process (the filter server's and rate-limit service's workers); :func:`point_between` turns
two totals into one chart point (rates, and TTFT / TBT quantiles from the histogram buckets
that filled between them, as Prometheus' ``histogram_quantile`` does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from controlplane.dashboard.errors import SourceError

__all__ = [
    "Point", "Totals", "answers_of", "batch_answered", "point_between", "quantile", "totals_of",
]  # fmt: skip

Buckets = dict[float, float]  # upper bound → cumulative count


@dataclass
class Totals:
    """Counters summed over processes (label sets the dashboard groups by)."""

    tokens: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, kind)
    streams: float = 0.0
    ttft: Buckets = field(default_factory=dict)
    tbt: Buckets = field(default_factory=dict)
    admitted: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, lane)
    shed: dict[tuple[str, str], float] = field(default_factory=dict)
    queued: dict[tuple[str, str], float] = field(default_factory=dict)
    in_flight: dict[str, float] = field(default_factory=dict)  # pool
    rejections: dict[str, float] = field(default_factory=dict)  # filter reason
    decisions: dict[str, float] = field(default_factory=dict)  # ratelimit result
    retry_count: dict[str, float] = field(default_factory=dict)  # tenant → over-limit answers
    retry_sum: dict[str, float] = field(default_factory=dict)  # tenant → Retry-After seconds
    limit: dict[str, float] = field(default_factory=dict)  # pool → admission capacity (summed)
    ladder_step: dict[str, float] = field(default_factory=dict)  # pool → highest step
    ladder_shed: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, lane)
    refused: dict[tuple[str, str], float] = field(default_factory=dict)  # (route, status)
    # (cluster, "503" or "5xx"): Envoy's answers for a route's cluster; its rate-limit filter
    # charges its 429s there too (measured: cluster.<c>.upstream_rq_429), ext_proc's do not
    upstream: dict[tuple[str, str], float] = field(default_factory=dict)
    # the batch runners' pages (controlplane/dashboard/batch.py)
    batch_lines: dict[str, float] = field(default_factory=dict)  # outcome → lines
    batch_runners: float = 0.0  # runner pages read
    batch_running: float = 0.0  # runners working on a job (lag > 0)
    batch_inflight: float = 0.0
    batch_window: float = 0.0
    batch_remaining: float = 0.0
    batch_lag: float = 0.0  # the oldest job being run, seconds since its submission
    batch_queued: float = 0.0  # jobs in the queue (each runner reports the same stream)

    def lane_arrivals(self) -> dict[tuple[str, str], float]:
        """Requests that reached admission by (pool, lane): admitted or shed, one or the other."""
        out = dict(self.admitted)
        for key, v in self.shed.items():
            out[key] = out.get(key, 0.0) + v
        return out


def _add(d: dict, key: object, value: float) -> None:  # type: ignore[type-arg]  # a counter dict of any key type, summed into
    d[key] = d.get(key, 0.0) + value


# every sample :func:`_take` reads starts with one of these; other lines are not parsed (a busy
# filter server's page is hundreds of KB, most of it per-tenant series the dashboard skips)
_WANTED = (
    "tokenweir_filters_tokens_total",
    "tokenweir_filters_streams_total",
    "tokenweir_filters_rejections_total",
    "tokenweir_filters_ladder_",
    "tokenweir_admission_admitted_total",
    "tokenweir_admission_shed_total",
    "tokenweir_admission_queued",
    "tokenweir_admission_in_flight",
    "tokenweir_admission_limit",
    "tokenweir_ratelimit_decisions_total",
    "tokenweir_ratelimit_retry_after_seconds_",
    "envoy_cluster_upstream_rq",
    "tokenweir_batch_",
)


# The TTFT and TBT bucket lines are most of a busy page (a series per tenant, model and lane,
# 12 buckets each: 5,000 lines at 100 tenants) and the parser costs ~45 µs a line; the
# dashboard only sums them by bound. These lines come from our own exporter (prometheus_client;
# inside a label value a quote is escaped, so ``le="`` is the bound's label), so the bound and
# the value are read straight off each line: a 786 KB page of 100 tenants costs ~12x less CPU
# (bench/dashboard_parse.py, docs/api.md).
_BUCKET_LINE = re.compile(
    r'^tokenweir_filters_(ttft|tbt)_seconds_bucket\{(?:[^\n]*?,)?le="([^"]+)"[^\n]*\} (\S+)$',
    re.M,
)


def _wanted(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith(_WANTED)) + "\n"


def _buckets(t: Totals, text: str) -> None:
    try:
        for kind, le, value in _BUCKET_LINE.findall(text):
            bound = math.inf if le in ("+Inf", "Inf") else float(le)
            _add(t.ttft if kind == "ttft" else t.tbt, bound, float(value))
    except ValueError as exc:
        raise SourceError(f"unparsable histogram bucket: {exc}") from exc


def totals_of(texts: Iterable[str]) -> Totals:
    """Sum the dashboard's metrics over the given Prometheus texts (one per process)."""
    t = Totals()
    for text in texts:
        try:
            families = list(text_string_to_metric_families(_wanted(text)))
        except ValueError as exc:
            raise SourceError(f"unparsable metrics text: {exc}") from exc
        _buckets(t, text)
        for fam in families:
            for s in fam.samples:
                _take(t, s.name, s.labels, s.value)
    return t


def _take(t: Totals, name: str, lb: Mapping[str, str], v: float) -> None:
    if name == "tokenweir_filters_tokens_total":
        _add(t.tokens, (lb.get("tenant", ""), lb.get("kind", "")), v)
    elif name == "tokenweir_filters_streams_total":
        t.streams += v
    elif name == "tokenweir_admission_admitted_total":
        _add(t.admitted, (lb.get("pool", ""), lb.get("lane", "")), v)
    elif name == "tokenweir_admission_shed_total":
        _add(t.shed, (lb.get("pool", ""), lb.get("lane", "")), v)
    elif name == "tokenweir_admission_queued":
        _add(t.queued, (lb.get("pool", ""), lb.get("lane", "")), v)
    elif name == "tokenweir_admission_in_flight":
        _add(t.in_flight, lb.get("pool", ""), v)
    elif name == "tokenweir_filters_rejections_total":
        _add(t.rejections, lb.get("reason", ""), v)
        _add(t.refused, (lb.get("route", ""), lb.get("status", "")), v)
    elif name == "tokenweir_admission_limit":
        _add(t.limit, lb.get("pool", ""), v)
    elif name == "tokenweir_filters_ladder_step":  # every process steps alone: the highest
        pool = lb.get("pool", "")
        t.ladder_step[pool] = max(v, t.ladder_step.get(pool, 0.0))
    elif name == "tokenweir_filters_ladder_shed_total":
        _add(t.ladder_shed, (lb.get("pool", ""), lb.get("lane", "")), v)
    # Envoy's /stats/prometheus (every gateway): answers of each pool's cluster by code
    elif name == "envoy_cluster_upstream_rq_xx":
        cls = lb.get("envoy_response_code_class", "")
        _add(t.upstream, (lb.get("envoy_cluster_name", ""), f"{cls}xx"), v)
    elif name == "envoy_cluster_upstream_rq":
        code = lb.get("envoy_response_code", "")
        _add(t.upstream, (lb.get("envoy_cluster_name", ""), code), v)
    elif name == "tokenweir_ratelimit_decisions_total":
        _add(t.decisions, lb.get("result", ""), v)
    elif name == "tokenweir_ratelimit_retry_after_seconds_count":
        _add(t.retry_count, lb.get("tenant", ""), v)
    elif name == "tokenweir_ratelimit_retry_after_seconds_sum":
        _add(t.retry_sum, lb.get("tenant", ""), v)
    elif name.startswith("tokenweir_batch_"):
        _batch(t, name, lb, v)


def _batch(t: Totals, name: str, lb: Mapping[str, str], v: float) -> None:
    if name == "tokenweir_batch_lines_total":
        _add(t.batch_lines, lb.get("outcome", ""), v)
    elif name == "tokenweir_batch_inflight":
        t.batch_runners += 1
        t.batch_inflight += v
    elif name == "tokenweir_batch_window":
        t.batch_window += v
    elif name == "tokenweir_batch_remaining_lines":
        t.batch_remaining += v
    elif name == "tokenweir_batch_lag_seconds":
        t.batch_running += 1 if v > 0 else 0
        t.batch_lag = max(t.batch_lag, v)
    elif name == "tokenweir_batch_queued_jobs":
        t.batch_queued = max(t.batch_queued, v)


def batch_answered(t: Totals) -> float:
    """Batch lines answered (completed or failed): their rate is the runners' throughput."""
    return t.batch_lines.get("completed", 0.0) + t.batch_lines.get("failed", 0.0)


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` (linear inside a bucket, like
    ``histogram_quantile``); None without observations. Past the last finite bound: that bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _delta(new: Mapping[float, float], old: Mapping[float, float]) -> Buckets:
    # a process that restarted lowers its counters: never below zero
    return {le: max(0.0, c - old.get(le, 0.0)) for le, c in new.items()}


def _kind(t: Totals, kind: str) -> float:
    return sum(v for (_, k), v in t.tokens.items() if k == kind)


def answers_of(t: Totals) -> tuple[float, float]:
    """(all, errors) answers to LLM requests: Envoy's per class on the pools' clusters
    (``pool_*``; the rate-limit filter's 429s among them) and the filter server's refusals."""
    every = errors = 0.0
    for (cluster, code), v in t.upstream.items():
        if cluster.startswith("pool_") and code.endswith("xx"):
            every += v
            errors += v if code[0] in "45" else 0.0
    refused = sum(t.refused.values())
    return every + refused, errors + refused


@dataclass(frozen=True)
class Point:
    """One chart point: rates over ``[old, new]`` and latency quantiles of what finished in it."""

    t: float
    requests_per_s: float
    completion_tokens_per_s: float
    prompt_tokens_per_s: float
    ttft_p50: float | None
    ttft_p95: float | None
    tbt_p50: float | None
    tbt_p95: float | None
    answers_per_s: float = 0.0
    errors_per_s: float = 0.0
    batch_lines_per_s: float = 0.0

    def to_json(self) -> dict[str, float | None]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 5)

        return {
            "t": round(self.t, 3),
            "requests_per_s": r(self.requests_per_s),
            "answers_per_s": r(self.answers_per_s),
            "errors_per_s": r(self.errors_per_s),
            "completion_tokens_per_s": r(self.completion_tokens_per_s),
            "prompt_tokens_per_s": r(self.prompt_tokens_per_s),
            "ttft_p50_s": r(self.ttft_p50),
            "ttft_p95_s": r(self.ttft_p95),
            "tbt_p50_s": r(self.tbt_p50),
            "tbt_p95_s": r(self.tbt_p95),
            "batch_lines_per_s": r(self.batch_lines_per_s),
        }


def point_between(old: Totals, t_old: float, new: Totals, t_new: float) -> Point:
    """Rates per second over the interval and quantiles of the observations made in it."""
    dt = max(t_new - t_old, 1e-9)
    ttft, tbt = _delta(new.ttft, old.ttft), _delta(new.tbt, old.tbt)
    (a_new, e_new), (a_old, e_old) = answers_of(new), answers_of(old)
    return Point(
        t=t_new,
        requests_per_s=max(0.0, new.streams - old.streams) / dt,
        completion_tokens_per_s=max(0.0, _kind(new, "completion") - _kind(old, "completion")) / dt,
        prompt_tokens_per_s=max(0.0, _kind(new, "prompt") - _kind(old, "prompt")) / dt,
        ttft_p50=quantile(0.5, ttft),
        ttft_p95=quantile(0.95, ttft),
        tbt_p50=quantile(0.5, tbt),
        tbt_p95=quantile(0.95, tbt),
        answers_per_s=max(0.0, a_new - a_old) / dt,
        errors_per_s=max(0.0, e_new - e_old) / dt,
        batch_lines_per_s=max(0.0, batch_answered(new) - batch_answered(old)) / dt,
    )
