"""Pure functions from scraped samples to saturation, replica and pool states, and the EDS mark.

Saturation of one replica (docs/operations.md, "Saturation signal"):

* no waiting requests: ``max(running / max_running_requests, KV in use / max_total_tokens)``;
  below 1 there is room, above 1 the replica runs more than the policy declares it can;
* requests waiting that the free running slots hold (and KV not full): they start at the
  scheduler's next step, so they count as running, ``(running + queued) / max_running_requests``
  (at most 1);
* requests waiting past that: ``1 + queued / max_queued_requests`` (without a declared queue
  bound, ``max_running_requests`` stands in for it), so 2 means the queue is full;
* no sample, or the last good one older than ``stale_after``: :data:`SATURATED`, ``stale``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from poolstate.metrics_text import ReplicaSample
from poolstate.state import SATURATED, PoolSummary, ReplicaState

__all__ = [
    "Capacity",
    "Hysteresis",
    "replica_saturation",
    "replica_state",
    "summarize_pool",
]


@dataclass(frozen=True, slots=True)
class Capacity:
    """One replica's declared capacity (policy first, then ``/get_server_info``)."""

    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None

    def merged(self, fallback: Capacity) -> Capacity:
        """Each value from ``self``, or from ``fallback`` where ``self`` has none."""
        return Capacity(
            self.max_running_requests or fallback.max_running_requests,
            self.max_queued_requests or fallback.max_queued_requests,
            self.max_total_tokens or fallback.max_total_tokens,
        )


@dataclass(frozen=True, slots=True)
class Hysteresis:
    """Mark at ``degrade_at``; unmark only at or below ``recover_at`` (``recover_at < degrade_at``)."""

    degrade_at: float = 1.0
    recover_at: float = 0.8

    def __post_init__(self) -> None:
        if not self.recover_at < self.degrade_at:
            raise ValueError("recover_at must be below degrade_at")

    def next(self, degraded: bool, saturation: float) -> bool:
        if degraded:
            return saturation > self.recover_at
        return saturation >= self.degrade_at


def replica_saturation(sample: ReplicaSample, cap: Capacity) -> float:
    """Pure: the saturation of a complete sample against ``cap`` (finite, >= 0)."""
    running = max(sample.running or 0, 0)
    queued = max(sample.queued or 0, 0)
    parts = [0.0]
    if cap.max_running_requests:
        parts.append(running / cap.max_running_requests)
    total = cap.max_total_tokens or sample.max_total_tokens
    if total and sample.used_tokens is not None:
        parts.append(max(sample.used_tokens, 0) / total)
    elif sample.token_usage is not None and math.isfinite(sample.token_usage):
        parts.append(max(sample.token_usage, 0.0))
    base = max(parts)
    if queued == 0:
        return base
    slots = cap.max_running_requests
    if slots and running + queued <= slots and base < 1.0:
        # they fit the free slots (and KV is not full): arrivals the scheduler takes at its
        # next step, not a queue. Read as waiting, one request caught between two steps made
        # an idle replica saturated (a ladder's step at 1.0 entered at 6% load, on a busy
        # interactive trace every few seconds, and EDS marked the replica degraded)
        return max(base, (running + queued) / slots)
    bound = cap.max_queued_requests or slots or 1
    return max(base, 1.0 + queued / bound)


def replica_state(
    sample: ReplicaSample | None,
    cap: Capacity,
    *,
    age_s: float,
    stale_after_s: float,
    answered: bool,
    degraded: bool = False,
) -> ReplicaState:
    """Pure: the published state of one replica.

    ``sample`` is the last good scrape (None: never), ``age_s`` how old it is, ``answered``
    whether the latest scrape succeeded, ``degraded`` the EDS mark already decided.
    """
    if sample is None or not sample.complete or age_s > stale_after_s:
        return ReplicaState(
            SATURATED, healthy=answered, stale=True, degraded=degraded, age_s=max(age_s, 0.0)
        )
    total = cap.max_total_tokens or sample.max_total_tokens
    kv = sample.token_usage
    if kv is None and total and sample.used_tokens is not None:
        kv = sample.used_tokens / total
    return ReplicaState(
        saturation=replica_saturation(sample, cap),
        running=max(sample.running or 0, 0),
        queued=max(sample.queued or 0, 0),
        token_usage=kv if kv is not None and math.isfinite(kv) else 0.0,
        gen_throughput=_finite(sample.gen_throughput),
        cache_hit_rate=_finite(sample.cache_hit_rate),
        healthy=answered,
        stale=False,
        degraded=degraded,
        age_s=max(age_s, 0.0),
    )


def summarize_pool(
    replicas: Mapping[str, ReplicaState], caps: Mapping[str, Capacity]
) -> PoolSummary:
    """Pure: the pool aggregate; capacity counts fresh replicas only."""
    fresh = [ep for ep, r in replicas.items() if not r.stale]
    return PoolSummary(
        endpoints=replicas,
        capacity_running=sum(caps[ep].max_running_requests or 0 for ep in fresh if ep in caps),
        capacity_queued=sum(caps[ep].max_queued_requests or 0 for ep in fresh if ep in caps),
    )


def _finite(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else 0.0
