"""Prometheus metrics of the filter server, on a registry the caller owns (no global state).

Every name is in docs/metrics.md. Tenant, model, lane and cost-center label values are folded
through the policy (``configure``): a value the policy does not name becomes ``other``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from policy.labels import PolicyLabels
from policy.model import Policy

__all__ = ["FilterMetrics"]

_M = TypeVar("_M", bound=MetricWrapperBase)

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# the tbt buckets; Envoy's usage meter counts gaps in the same ones (GAP_BUCKETS, rendered by
# controlplane/translate/usage_meter.py; tests/filters/test_usage_log.py checks they agree)
_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_RATE = (1, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
_DURATION = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_RATIO = (0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0)


class FilterMetrics:
    """Counters and histograms; label values are route, tenant, model, plugin, reason."""

    def __init__(
        self, registry: CollectorRegistry | None = None, policy: Policy | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.labels: PolicyLabels | None = None
        self._policy: Policy | None = None
        self._tenant: Callable[[str], str] = _same
        self._model: Callable[[str], str] = _same
        self._lane: Callable[[str], str] = _same
        r = self.registry
        p = "tokenweir_filters_"
        self.streams = Counter(p + "streams", "ext_proc streams by route", ["route"], registry=r)
        self.rejections = Counter(
            p + "rejections", "requests answered with a 4xx", ["route", "reason", "status"],
            registry=r,
        )  # fmt: skip
        self.plugin_errors = Counter(
            p + "plugin_errors", "plugin failures", ["route", "plugin", "phase"], registry=r
        )
        self.redis_errors = Counter(p + "redis_errors", "Redis lookups that failed", registry=r)
        self.key_fallbacks = Counter(
            p + "key_fallbacks", "API key answers given without Redis (Redis failed), by source",
            ["answer"], registry=r,
        )  # fmt: skip
        self.unknown_routes = Counter(
            p + "unknown_route", "streams naming a route the policy lacks", registry=r
        )
        self.ttft = Histogram(
            p + "ttft_seconds", "time to first token (request start to first body chunk)",
            ["tenant", "model", "lane"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.tbt = Histogram(
            p + "tbt_seconds", "time between streamed chunks", ["tenant", "model", "lane"],
            buckets=_GAP, registry=r,
        )  # fmt: skip
        self.tokens_per_second = Histogram(
            p + "tokens_per_second", "completion tokens per second after the first token",
            ["tenant", "model"], buckets=_RATE, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            p + "tokens", "tokens reported by backends", ["tenant", "model", "kind"], registry=r
        )
        self.estimate_ratio = Histogram(
            p + "prompt_estimate_ratio", "estimated / reported prompt tokens", ["model"],
            buckets=_RATIO, registry=r,
        )  # fmt: skip
        self.clamped = Counter(
            p + "max_tokens_clamped", "requests whose max_tokens was lowered or set",
            ["tenant", "why"], registry=r,
        )  # fmt: skip
        self.reservations = Counter(
            p + "reservations", "output tokens reserved from: tenant (its learned quantile), "
            "pooled (the model's), max_tokens (nothing learned, or the quantile reaches it)",
            ["source"], registry=r,
        )  # fmt: skip
        self.idempotency = Counter(
            p + "idempotency", "requests with an idempotency key, by outcome (claimed, stored, "
            "replay, in_flight, mismatch, unstored, too_large, released, invalid, missing, "
            "store_error)", ["route", "outcome"], registry=r,
        )  # fmt: skip
        self.collapsed = Counter(
            p + "collapsed", "requests that joined another identical request's backend run "
            "(role follower) or led one (role leader)", ["route", "role"], registry=r,
        )  # fmt: skip
        self.tokens_saved = Counter(
            p + "backend_tokens_saved", "backend tokens (prompt + completion) not spent because "
            "an answer was replayed or shared", ["route", "how"], registry=r,
        )  # fmt: skip
        self.version_responses = Counter(
            p + "version_responses", "responses of pools with a canary, by the version that "
            "answered (Envoy's x-tokenweir-version) and status class", ["pool", "version", "code"],
            registry=r,
        )  # fmt: skip
        self.canary_forced = Counter(
            p + "canary_forced", "requests that asked for a version with the force header "
            "(canary, baseline, or ignored: tenant not allowed)", ["pool", "outcome"], registry=r,
        )  # fmt: skip

        self.topups = Counter(
            p + "topups", "in-stream budget top-ups of streams past their reservation, by "
            "result (granted, refused, no_record, error)", ["tenant", "result"], registry=r,
        )  # fmt: skip
        self.budget_stops = Counter(
            p + "budget_stops", "streams ended at the tenant's budget (finish_reason length)",
            ["route", "tenant"], registry=r,
        )  # fmt: skip
        self.backend_aborts = Counter(
            p + "backend_aborts", "backend aborts (POST /abort_request) of streams stopped at "
            "the budget, by result (sent, failed, skipped: no replica or rid known)", ["result"],
            registry=r,
        )  # fmt: skip

        self.tls_renewals = Counter(
            p + "tls_renewals", "renewed TLS files of the ext_proc port loaded before a new "
            "connection's handshake, by result (ok, error: refused, the old certificate kept)",
            ["result"], registry=r,
        )  # fmt: skip

        self.requests = Counter(
            p + "requests", "finished LLM requests by outcome (ok, rejected, rate_limited, "
            "error, no_output)", ["route", "lane", "model", "tenant", "outcome"], registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            p + "request_duration_seconds", "request start to the end of its response",
            ["route", "lane", "model"], buckets=_DURATION, registry=r,
        )  # fmt: skip
        self.cost = Counter(
            p + "cost_usd", "money spent at the policy's prices (usage the backends reported)",
            ["tenant", "cost_center", "model"], registry=r,
        )  # fmt: skip

        self._timers: dict[tuple[str, str, str], tuple[Histogram, Histogram]] = {}
        self._streams: dict[str, Counter] = {}
        self._counters: dict[tuple[str, str], tuple[Counter, Counter, Counter]] = {}
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}
        if policy is not None:
            self.configure(policy)

    def configure(self, policy: Policy) -> None:
        """Fold label values through ``policy`` from now on (at start and on every reload)."""
        self.labels = PolicyLabels.of(policy)
        self._policy = policy
        self._tenant, self._model, self._lane = (
            self.labels.tenant,
            self.labels.model,
            self.labels.lane,
        )
        self._timers.clear()
        self._counters.clear()
        self._children.clear()

    def child(self, metric: _M, *labels: str) -> _M:
        """``metric.labels(*labels)``, looked up once (label values already folded)."""
        key = (id(metric), *labels)
        c = self._children.get(key)
        if c is None:
            if len(self._children) > 10_000:
                self._children.clear()
            c = self._children[key] = metric.labels(*labels)
        return cast("_M", c)  # the child of a metric is of the metric's own class

    def tenant_label(self, tenant: str | None) -> str:
        return str(self._tenant(tenant or "unknown"))

    def model_label(self, model: str | None) -> str:
        return str(self._model(model or "unknown"))

    def lane_label(self, lane: str | None) -> str:
        return str(self._lane(lane or "unknown"))

    def cost_center_label(self, tenant: str | None) -> str:
        if self.labels is None:
            return "other"
        return self.labels.cost_center_of(self._policy, tenant)

    def stream_timers(
        self, tenant: str | None, model: str | None, lane: str | None = None
    ) -> tuple[Histogram, Histogram]:
        """The (ttft, tbt) histogram children of one tenant, model and lane, looked up once."""
        key = (self.tenant_label(tenant), self.model_label(model), self.lane_label(lane))
        timers = self._timers.get(key)
        if timers is None:
            if len(self._timers) > 10_000:
                self._timers.clear()
            timers = self._timers[key] = (self.ttft.labels(*key), self.tbt.labels(*key))
        return timers

    def token_counters(
        self, tenant: str | None, model: str | None
    ) -> tuple[Counter, Counter, Counter]:
        """The (prompt, completion, cached) token counter children of one tenant and model."""
        key = (self.tenant_label(tenant), self.model_label(model))
        c = self._counters.get(key)
        if c is None:
            if len(self._counters) > 10_000:
                self._counters.clear()
            t = self.tokens
            c = self._counters[key] = (
                t.labels(*key, "prompt"),
                t.labels(*key, "completion"),
                t.labels(*key, "cached"),
            )
        return c

    def stream_started(self, route: str) -> None:
        child = self._streams.get(route)
        if child is None:
            child = self._streams[route] = self.streams.labels(route)
        child.inc()

    # ChainEvents
    def rejected(self, route: str, reason: str, status: int) -> None:
        self.rejections.labels(route, reason, str(status)).inc()

    def plugin_failed(self, route: str, plugin: str, phase: str) -> None:
        self.plugin_errors.labels(route, plugin, phase).inc()

    def request_done(
        self, route: str, lane: str | None, model: str | None, tenant: str | None,
        outcome: str, seconds: float,
    ) -> None:  # fmt: skip
        """One finished request: the RED counter and its duration."""
        ln, md = self.lane_label(lane), self.model_label(model)
        self.child(self.requests, route, ln, md, self.tenant_label(tenant), outcome).inc()
        self.child(self.duration, route, ln, md).observe(seconds)

    @staticmethod
    def add_observations(child: Histogram, counts: list[int], total: float) -> None:
        """Add to a histogram child what ``observe`` would have added for values that fell
        ``counts[i]`` times into bucket ``i`` (the first bound each was under, as ``observe``
        counts) and summed to ``total`` — Envoy's usage meter counts chunk gaps that way."""
        buckets = child._buckets
        if len(counts) != len(buckets):
            raise ValueError(f"{len(counts)} bucket counts for a histogram of {len(buckets)}")
        child._raise_if_not_observable()
        child._sum.inc(total)
        for bucket, n in zip(buckets, counts, strict=True):
            if n > 0:
                bucket.inc(n)

    def spent(self, tenant: str | None, model: str | None, usd: float) -> None:
        if usd > 0:
            t = self.tenant_label(tenant)
            cc, md = self.cost_center_label(tenant), self.model_label(model)
            self.child(self.cost, t, cc, md).inc(usd)


def _same(value: str) -> str:
    return value
