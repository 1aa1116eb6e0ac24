"""Prometheus metrics of the endpoint picker (on the filter server's registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CACHED_ERROR_BUCKETS", "TTFT_RATIO_BUCKETS", "PickerMetrics"]

# signed: below 0 the picker predicted more cache than the replica had (it over-promised)
CACHED_ERROR_BUCKETS = (-1.0, -0.5, -0.25, -0.1, -0.02, 0.02, 0.1, 0.25, 0.5, 1.0)
# 0.8 and 1.25: a prediction "within 25%" of the actual TTFT (docs/operations.md)
TTFT_RATIO_BUCKETS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0)


class PickerMetrics:
    """Label values: pool, reason, replica (host:port)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        p = "tokenweir_picker_"
        self.picks = Counter(
            p + "picks", "picks by reason (cache, load; cold and no_prompt fall back to ring hash)",
            ["pool", "reason"], registry=r,
        )  # fmt: skip
        self.fallbacks = Counter(
            p + "fallbacks", "requests left to Envoy's ring hash, by reason", ["pool", "reason"],
            registry=r,
        )  # fmt: skip
        self.predicted_tokens = Counter(
            p + "predicted_cached_tokens", "cached prompt tokens the picker predicted", ["pool"],
            registry=r,
        )  # fmt: skip
        self.actual_tokens = Counter(
            p + "actual_cached_tokens", "cached prompt tokens the backends reported (usage)",
            ["pool"], registry=r,
        )  # fmt: skip
        self.cached_error = Histogram(
            p + "cached_prediction_error",
            "routing regret: (actual - predicted) cached prompt tokens over the prompt's tokens, "
            "per request the picker placed",
            ["pool", "replica"], registry=r, buckets=CACHED_ERROR_BUCKETS,
        )  # fmt: skip
        self.ttft_ratio = Histogram(
            p + "ttft_ratio",
            "routing regret: actual over predicted time to first token, per request the picker "
            "placed once its replica's latency was learned",
            ["pool", "replica"], registry=r, buckets=TTFT_RATIO_BUCKETS,
        )  # fmt: skip
        self.index_blocks = Gauge(
            p + "index_blocks",
            "anchor block hashes in the prefix index, summed over replicas",
            ["pool"],
            registry=r,
        )
        self.known = Gauge(
            p + "replica_known", "1 while the index follows the replica's KV events",
            ["pool", "replica"], registry=r,
        )  # fmt: skip
        self.event_lag = Gauge(
            p + "event_lag_seconds", "now minus the publish time of the last applied batch",
            ["pool", "replica"], registry=r,
        )  # fmt: skip
        self.vllm_skipped = Gauge(
            p + "vllm_blocks_left_out",
            "vLLM pools: stored blocks the index could not place (parent unseen, extra keys or "
            "LoRA, another KV-cache group, block_size other than routing.page_size), since start",
            ["pool", "replica"], registry=r,
        )  # fmt: skip
        self.backlog = Gauge(
            p + "backlog_tokens",
            "prompt tokens sent to the replica and not yet reported prefilled (its KV events)",
            ["pool", "replica"], registry=r,
        )  # fmt: skip
        self.mapped_tokens = Counter(
            p + "mapped_tokens", "tokens hashed off the request path (checkpoint map)",
            ["pool"], registry=r,
        )  # fmt: skip
        self.map_failed = Counter(
            p + "map_failed",
            "mapper calls that failed (its worker process died, timed out or raised); their "
            "prompts stay unmapped until seen again",
            ["pool"], registry=r,
        )  # fmt: skip
        self.map_dropped = Counter(
            p + "map_dropped", "prompts not mapped because the mapper queue was full", ["pool"],
            registry=r,
        )  # fmt: skip
        self.config_errors = Counter(
            p + "config_errors",
            "pickers not started because routing.tokenizer could not be loaded (the pool routes "
            "by ring hash; tried again at the next policy load)",
            ["pool"], registry=r,
        )  # fmt: skip
        self.coalesced = Counter(
            p + "coalesced",
            "requests that waited for the same prefix's prefill on their replica, by how the "
            "wait ended (stored, ended: the lead's request ended, timed_out)",
            ["pool", "outcome"], registry=r,
        )  # fmt: skip
        self.coalesce_wait = Histogram(
            p + "coalesce_wait_seconds", "how long a request waited for another's prefill",
            ["pool"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )  # fmt: skip
