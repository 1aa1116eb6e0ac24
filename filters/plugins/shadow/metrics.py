"""Summary metrics of the primary/shadow pairs (docs/metrics.md), on the filter server's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from runtime.shadow import Pair

__all__ = ["ShadowMetrics"]

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ShadowMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p, r = "tokenweir_filters_shadow_", registry
        self.sampled = Counter(
            p + "sampled", "requests sampled for a mirror", ["route"], registry=r
        )
        self.pairs = Counter(p + "pairs", "primary/shadow pairs completed", ["route"], registry=r)
        self.errors = Counter(
            p + "errors", "pairs whose side was an error, by kind", ["route", "side", "kind"],
            registry=r,
        )  # fmt: skip
        self.same_tokens = Counter(
            p + "same_output_tokens", "pairs where both answered with the same output tokens",
            ["route"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            p + "latency_seconds", "end-to-end latency of good answers, per side",
            ["route", "side"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.dropped = Counter(
            p + "dropped", "mirrors or pairs given up (unknown mirror, store queue full, stale)",
            ["reason"], registry=r,
        )  # fmt: skip

    def pair(self, pair: Pair) -> None:
        route = pair.route
        self.pairs.labels(route).inc()
        for name, side in (("primary", pair.primary), ("shadow", pair.shadow)):
            if side.error is not None:
                self.errors.labels(route, name, side.error).inc()
            elif side.latency_s is not None:
                self.latency.labels(route, name).observe(side.latency_s)
        if (
            pair.primary.ok
            and pair.shadow.ok
            and pair.primary.completion_tokens == pair.shadow.completion_tokens
        ):
            self.same_tokens.labels(route).inc()
