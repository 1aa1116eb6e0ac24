"""From limits to the checks one reserve runs: key names, window indexes and costs (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from ratelimit_service.config import Limit
from ratelimit_service.keys import bucket_key, window_key
from ratelimit_service.limiter import Check
from ratelimit_service.windows import window

__all__ = ["checks_for", "scaled"]


def checks_for(subject: str, limits: Iterable[Limit], tokens: int, now_us: int) -> list[Check]:
    """Token limits cost ``tokens``, request-count limits cost 1."""
    out = []
    for lim in limits:
        cost = tokens if lim.tokens else 1
        if lim.unit == "bucket":
            key = bucket_key(subject, lim.quota)
            out.append(Check(key, "b", cost, lim.limit, lim.rate, 0, lim.shadow, lim.tokens))
        else:
            index, reset_us = window(lim.unit, now_us)
            key = window_key(subject, lim.quota, lim.unit, index)
            out.append(Check(key, "w", cost, lim.limit, 0.0, reset_us, lim.shadow, lim.tokens))
    return out


def scaled(limits: Iterable[Limit], replicas: int) -> list[Limit]:
    """The share of each limit one replica enforces on its own (local fail-open buckets)."""
    if replicas <= 1:
        return list(limits)
    return [
        Limit(x.quota, x.unit, max(1, x.limit // replicas), x.rate / replicas, x.shadow, x.tokens)
        for x in limits
    ]
