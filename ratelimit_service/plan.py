"""From limits to the checks one reserve runs: key names, window indexes and costs (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from quota.config import Limit
from quota.keys import bucket_key, window_key
from quota.windows import window
from ratelimit_service.limiter import Check

__all__ = ["WindowClock", "checks_for", "scaled"]


class WindowClock:
    """``window(unit, now_us)`` remembered until the window ends (no calendar math per call).

    A remembered answer is reused for ``computed_at <= now_us < reset``: every such instant lies in
    the same window as ``computed_at`` (a clock going backwards just recomputes)."""

    def __init__(self) -> None:
        self._current: dict[str, tuple[int, int, int]] = {}  # unit → computed_at, reset, index

    def __call__(self, unit: str, now_us: int) -> tuple[int, int]:
        hit = self._current.get(unit)
        if hit is not None and hit[0] <= now_us < hit[1]:
            return hit[2], hit[1]
        index, reset = window(unit, now_us)
        self._current[unit] = (now_us, reset, index)
        return index, reset


def checks_for(
    subject: str,
    limits: Iterable[Limit],
    tokens: int,
    now_us: int,
    window_of: Callable[[str, int], tuple[int, int]] = window,
    *,
    usd: int = 0,
) -> list[Check]:
    """Token limits cost ``tokens``, money limits ``usd`` (micro-USD), request-count limits 1."""
    out = []
    for lim in limits:
        cost = usd if lim.money else tokens if lim.tokens else 1
        if lim.unit == "bucket":
            key = bucket_key(subject, lim.quota)
            out.append(Check(key, "b", cost, lim.limit, lim.rate, 0, lim.shadow, lim.tokens))
        else:
            index, reset_us = window_of(lim.unit, now_us)
            key = window_key(subject, lim.quota, lim.unit, index)
            c = Check(key, "w", cost, lim.limit, 0.0, reset_us, lim.shadow, lim.tokens, lim.money)
            out.append(c)
    return out


def scaled(limits: Iterable[Limit], replicas: int) -> list[Limit]:
    """The share of each limit one replica enforces on its own (local fail-open buckets)."""
    if replicas <= 1:
        return list(limits)
    return [
        Limit(
            x.quota,
            x.unit,
            max(1, x.limit // replicas),
            x.rate / replicas,
            x.shadow,
            x.tokens,
            x.money,
        )
        for x in limits
    ]
