"""Prometheus metrics of the filter server, on a registry the caller owns (no global state)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["FilterMetrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_RATE = (1, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
_RATIO = (0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0)


class FilterMetrics:
    """Counters and histograms; label values are route, tenant, model, plugin, reason."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
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
            ["tenant", "model"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.tbt = Histogram(
            p + "tbt_seconds", "time between streamed chunks", ["tenant", "model"],
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

        self._timers: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._streams: dict[str, Any] = {}
        self._counters: dict[tuple[str, str], tuple[Any, ...]] = {}

    def stream_timers(self, tenant: str | None, model: str | None) -> tuple[Any, Any]:
        """The (ttft, tbt) histogram children of one tenant and model, looked up once."""
        key = (tenant or "unknown", model or "unknown")
        timers = self._timers.get(key)
        if timers is None:
            if len(self._timers) > 10_000:
                self._timers.clear()
            timers = self._timers[key] = (self.ttft.labels(*key), self.tbt.labels(*key))
        return timers

    def token_counters(self, tenant: str | None, model: str | None) -> tuple[Any, Any, Any]:
        """The (prompt, completion, cached) token counter children of one tenant and model."""
        key = (tenant or "unknown", model or "unknown")
        c = self._counters.get(key)
        if c is None:
            if len(self._counters) > 10_000:
                self._counters.clear()
            t = self.tokens
            c = self._counters[key] = tuple(
                t.labels(*key, kind) for kind in ("prompt", "completion", "cached")
            )  # type: ignore[assignment]
        return c  # type: ignore[return-value]

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
