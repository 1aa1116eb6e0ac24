"""Pure: the SGLang counters the online planner reads out of a replica's ``/metrics`` text.

The pool scraper already reads every replica's page (controlplane/saturation); it hands the text
to the planner's tap, which keeps only these lines (one regex pass, no full parse).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ReplicaCounters", "parse_counters"]

_NAMES = {
    "sglang:num_requests_total": "finished",
    "sglang:prompt_tokens_total": "prompt",
    "sglang:generation_tokens_total": "generated",
    "sglang:cached_tokens_total": "cached",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
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

    @property
    def inflight(self) -> float:
        return self.running + self.queued


def parse_counters(text: str) -> ReplicaCounters | None:
    """The counters in ``text`` summed over label sets; None when the request counter is absent
    (not an SGLang page)."""
    sums: dict[str, float] = {}
    for name, raw in _LINE.findall(text):
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            key = _NAMES[name]
            sums[key] = sums.get(key, 0.0) + value
    if "finished" not in sums:
        return None
    return ReplicaCounters(**sums)
