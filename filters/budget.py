"""What a tenant's token budget still holds, for the max_tokens clamp.

The rate-limit service owns the numbers (``ratelimit_service.reader.QuotaReader``); this module
adapts it and puts a short cache in front: a value read from Redis is reused for ``ttl`` seconds
and lowered by every reservation this process makes meanwhile, so the clamp never loosens within
the TTL (it can only be stale towards "less", until the next read). ``None`` means "unknown or
unlimited": the clamp then uses the tier cap alone. The clamp is advice; the rate-limit service
decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Budget", "CachedBudget", "NoBudget", "quota_reader_budget"]

_log = logging.getLogger(__name__)


class Budget(Protocol):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None: ...

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        """This process just asked the rate-limit service for ``tokens``."""
        ...


class NoBudget:
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        return None

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        return None


class _Reader(Protocol):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None: ...


class CachedBudget:
    """A reader behind a ``ttl``-second cache with local debits (``ttl=0``: no cache)."""

    def __init__(
        self,
        reader: _Reader,
        *,
        clock: Callable[[], float],
        ttl: float = 0.25,
        max_entries: int = 100_000,
    ) -> None:
        self._reader = reader
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._cache: dict[tuple[str, str | None, str | None], list[Any]] = {}

    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        key = (tenant, model, lane)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return None if hit[1] is None else max(0, int(hit[1]))
        value = await self._reader.remaining(tenant, model, lane)
        if self._ttl > 0:
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[key] = [now + self._ttl, value]
        return value

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        hit = self._cache.get((tenant, model, lane))
        if hit is not None and hit[1] is not None:
            hit[1] -= tokens


def quota_reader_budget(
    redis: Any, policy: Any, *, clock: Callable[[], float], ttl: float = 0.25
) -> Budget:
    """The rate-limit service's reader over ``redis`` (cached), or :class:`NoBudget`."""
    try:
        from ratelimit_service.reader import QuotaReader
    except ImportError:
        _log.warning("ratelimit_service.reader is not available: max_tokens uses tier caps only")
        return NoBudget()
    return CachedBudget(QuotaReader(redis, policy), clock=clock, ttl=ttl)
