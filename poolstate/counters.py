"""Pure: the counters read out of a replica's ``/metrics`` text (SGLang's names or vLLM's).

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

# each engine's names for the same counters: SGLang's, then vLLM's (``vllm/v1/metrics/
# loggers.py``). Where vLLM has renamed one, every name it used is listed, newest first: the
# first found on a page wins (vLLM exports some twice, under the old name and the new, and
# summing them would count twice). vLLM's ``time_per_output_token_seconds`` observed every
# token gap until ``inter_token_latency_seconds`` took that role (later versions keep the old
# name per request), so it is read only on pages without the newer one.
_NAMES: dict[str, tuple[str, int]] = {
    "sglang:num_requests_total": ("finished", 0),
    "sglang:prompt_tokens_total": ("prompt", 0),
    "sglang:generation_tokens_total": ("generated", 0),
    "sglang:cached_tokens_total": ("cached", 0),
    "sglang:num_running_reqs": ("running", 0),
    "sglang:num_queue_reqs": ("queued", 0),
    # the histograms' sums and counts: each replica's measured speed (rates.py)
    "sglang:inter_token_latency_seconds_sum": ("itl_sum", 0),
    "sglang:inter_token_latency_seconds_count": ("itl_count", 0),
    "sglang:time_to_first_token_seconds_sum": ("ttft_sum", 0),
    "sglang:time_to_first_token_seconds_count": ("ttft_count", 0),
    "sglang:queue_time_seconds_sum": ("queue_sum", 0),
    "sglang:queue_time_seconds_count": ("queue_count", 0),
    "vllm:request_success_total": ("finished", 0),  # one series per finish reason: summed
    "vllm:prompt_tokens_total": ("prompt", 0),
    "vllm:generation_tokens_total": ("generated", 0),
    "vllm:prefix_cache_hits_total": ("cached", 0),  # tokens
    "vllm:gpu_prefix_cache_hits_total": ("cached", 1),
    "vllm:num_requests_running": ("running", 0),
    "vllm:num_requests_waiting": ("queued", 0),
    "vllm:inter_token_latency_seconds_sum": ("itl_sum", 0),
    "vllm:inter_token_latency_seconds_count": ("itl_count", 0),
    "vllm:time_per_output_token_seconds_sum": ("itl_sum", 1),
    "vllm:time_per_output_token_seconds_count": ("itl_count", 1),
    "vllm:time_to_first_token_seconds_sum": ("ttft_sum", 0),
    "vllm:time_to_first_token_seconds_count": ("ttft_count", 0),
    "vllm:request_queue_time_seconds_sum": ("queue_sum", 0),  # the WAITING phase
    "vllm:request_queue_time_seconds_count": ("queue_count", 0),
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
    summed over its label sets (data-parallel ranks, engines); where an engine names one
    counter twice (a rename), the newest name found; NaN and infinite values are left out."""
    found: dict[tuple[str, int], float] = {}
    for name, raw in _LINE.findall(text):
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            key = _NAMES[name]
            found[key] = found.get(key, 0.0) + value
    sums: dict[str, float] = {}
    for (field, _newest_first), value in sorted(found.items(), key=lambda kv: kv[0][1]):
        sums.setdefault(field, value)
    return sums


def parse_counters(text: str) -> ReplicaCounters | None:
    """The counters in ``text`` summed over label sets; None when the request counter is absent
    (neither an SGLang nor a vLLM page)."""
    sums = counter_sums(text)
    if "finished" not in sums:
        return None
    return ReplicaCounters(**sums)
