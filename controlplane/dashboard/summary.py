"""Pure arithmetic behind the dashboard: metric texts → :class:`Totals` → chart :class:`Point`.

:func:`totals_of` sums the counters and histograms the dashboard shows over every scraped
process (the filter server's and rate-limit service's workers); :func:`point_between` turns
two totals into one chart point (rates, and TTFT / TBT quantiles from the histogram buckets
that filled between them, as Prometheus' ``histogram_quantile`` does).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from controlplane.dashboard.errors import SourceError

__all__ = ["Point", "Totals", "point_between", "quantile", "totals_of"]

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


def _add(d: dict, key: object, value: float) -> None:  # type: ignore[type-arg]
    d[key] = d.get(key, 0.0) + value


def _le(labels: Mapping[str, str]) -> float:
    raw = labels.get("le", "+Inf")
    return math.inf if raw in ("+Inf", "Inf") else float(raw)


def totals_of(texts: Iterable[str]) -> Totals:
    """Sum the dashboard's metrics over the given Prometheus texts (one per process)."""
    t = Totals()
    for text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as exc:
            raise SourceError(f"unparsable metrics text: {exc}") from exc
        for fam in families:
            for s in fam.samples:
                _take(t, s.name, s.labels, s.value)
    return t


def _take(t: Totals, name: str, lb: Mapping[str, str], v: float) -> None:
    if name == "tokenweir_filters_tokens_total":
        _add(t.tokens, (lb.get("tenant", ""), lb.get("kind", "")), v)
    elif name == "tokenweir_filters_streams_total":
        t.streams += v
    elif name == "tokenweir_filters_ttft_seconds_bucket":
        _add(t.ttft, _le(lb), v)
    elif name == "tokenweir_filters_tbt_seconds_bucket":
        _add(t.tbt, _le(lb), v)
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
    elif name == "tokenweir_ratelimit_decisions_total":
        _add(t.decisions, lb.get("result", ""), v)
    elif name == "tokenweir_ratelimit_retry_after_seconds_count":
        _add(t.retry_count, lb.get("tenant", ""), v)
    elif name == "tokenweir_ratelimit_retry_after_seconds_sum":
        _add(t.retry_sum, lb.get("tenant", ""), v)


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

    def to_json(self) -> dict[str, float | None]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 5)

        return {
            "t": round(self.t, 3),
            "requests_per_s": r(self.requests_per_s),
            "completion_tokens_per_s": r(self.completion_tokens_per_s),
            "prompt_tokens_per_s": r(self.prompt_tokens_per_s),
            "ttft_p50_s": r(self.ttft_p50),
            "ttft_p95_s": r(self.ttft_p95),
            "tbt_p50_s": r(self.tbt_p50),
            "tbt_p95_s": r(self.tbt_p95),
        }


def point_between(old: Totals, t_old: float, new: Totals, t_new: float) -> Point:
    """Rates per second over the interval and quantiles of the observations made in it."""
    dt = max(t_new - t_old, 1e-9)
    ttft, tbt = _delta(new.ttft, old.ttft), _delta(new.tbt, old.tbt)
    return Point(
        t=t_new,
        requests_per_s=max(0.0, new.streams - old.streams) / dt,
        completion_tokens_per_s=max(0.0, _kind(new, "completion") - _kind(old, "completion")) / dt,
        prompt_tokens_per_s=max(0.0, _kind(new, "prompt") - _kind(old, "prompt")) / dt,
        ttft_p50=quantile(0.5, ttft),
        ttft_p95=quantile(0.95, ttft),
        tbt_p50=quantile(0.5, tbt),
        tbt_p95=quantile(0.95, tbt),
    )
