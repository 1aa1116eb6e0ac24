"""Pure: the SGLang counters read out of a replica's ``/metrics`` text.

The pool scraper already reads every replica's page (controlplane/saturation); it hands the text
to the online planner's tap, which keeps only these lines (one regex pass, no full parse): the
request and token counters (controlplane/autoscale/demand.py) and the sums and counts of the
ITL, TTFT and queue-time histograms (each replica's measured speed, autoscale/rates.py). The
batch runner's step meter reads the ITL sum and count the same way (batch_service/stepmeter.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ReplicaCounters", "counter_sums", "parse_counters"]

_NAMES = {
    "sglang:num_requests_total": "finished",
    "sglang:prompt_tokens_total": "prompt",
    "sglang:generation_tokens_total": "generated",
    "sglang:cached_tokens_total": "cached",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    # the histograms' sums and counts: each replica's measured speed (rates.py)
    "sglang:inter_token_latency_seconds_sum": "itl_sum",
    "sglang:inter_token_latency_seconds_count": "itl_count",
    "sglang:time_to_first_token_seconds_sum": "ttft_sum",
    "sglang:time_to_first_token_seconds_count": "ttft_count",
    "sglang:queue_time_seconds_sum": "queue_sum",
    "sglang:queue_time_seconds_count": "queue_count",
}
_LINE = re.compile(
    "^(" + "|".join(re.escape(n) for n in _NAMES) + r")(?:\{[^\n]*\})?[ \t]+(\S+)", re.M
)


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """Totals since the replica started, and its requests in flight now."""

    finished: float = 0.0
    prompt: float = 0.0
    generated: float = 0.0
    cached: float = 0.0
    running: float = 0.0
    queued: float = 0.0
    itl_sum: float = 0.0  # seconds between tokens, summed; itl_count gaps
    itl_count: float = 0.0
    ttft_sum: float = 0.0  # arrival → first token, summed over ttft_count requests
    ttft_count: float = 0.0
    queue_sum: float = 0.0  # arrival → admission (prefill starts), over queue_count requests
    queue_count: float = 0.0

    @property
    def inflight(self) -> float:
        return self.running + self.queued


def counter_sums(text: str) -> dict[str, float]:
    """The counters found in ``text`` (by their :class:`ReplicaCounters` field names), each
    summed over its label sets (data-parallel ranks); NaN and infinite values are left out."""
    sums: dict[str, float] = {}
    for name, raw in _LINE.findall(text):
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            key = _NAMES[name]
            sums[key] = sums.get(key, 0.0) + value
    return sums


def parse_counters(text: str) -> ReplicaCounters | None:
    """The counters in ``text`` summed over label sets; None when the request counter is absent
    (not an SGLang page)."""
    sums = counter_sums(text)
    if "finished" not in sums:
        return None
    return ReplicaCounters(**sums)
