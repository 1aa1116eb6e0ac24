"""What a tenant's token budget still holds, for the max_tokens clamp.

The numbers live in Redis in the shared quota layout (``quota.reader.QuotaReader``,
the rate-limit service writes them); this module adapts the reader and puts a short cache in front: a value read from Redis is reused for ``ttl`` seconds
and lowered by every reservation this process makes meanwhile, so the clamp never loosens within
the TTL (it can only be stale towards "less", until the next read). ``None`` means "unknown or
unlimited": the clamp then uses the tier cap alone. The clamp is advice; the rate-limit service
decides.

Concurrent misses of one (tenant, model, lane) share one read (single flight: a burst of 300
requests of one tenant is one Redis call), run in a task of the cache so a caller that gives up
does not cancel it for the others. A failed read answers the last value read (or ``None``), is
counted by ``on_error`` and logged at most once per ``log_interval``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

from policy.model import Policy
from quota.errors import QuotaUnavailable
from quota.reader import QuotaReader
from runtime.tasks import stop_task
from runtime.throttled_log import ThrottledLog

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Budget", "CachedBudget", "NoBudget", "quota_reader_budget"]

_log = logging.getLogger(__name__)


class Budget(Protocol):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None: ...

    def cached(self, tenant: str, model: str | None, lane: str | None) -> tuple[bool, int | None]:
        """``(True, remaining)`` when known without I/O, else ``(False, None)``: the clamp then
        awaits :meth:`remaining` under its timeout (a hit needs neither)."""
        ...

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        """This process just asked the rate-limit service for ``tokens``."""
        ...


class NoBudget:
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        return None

    def cached(self, tenant: str, model: str | None, lane: str | None) -> tuple[bool, int | None]:
        return True, None

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        return None


class _Reader(Protocol):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None: ...


_Key = tuple[str, str | None, str | None]


@dataclass(slots=True)
class _Hit:
    """A cached read: tokens left (None: no budget applies), less what was reserved since."""

    expires: float
    left: int | None


def _left(hit: _Hit) -> int | None:
    return None if hit.left is None else max(0, hit.left)


_FAILURES = (RedisError, OSError, TimeoutError, QuotaUnavailable)


class CachedBudget:
    """A reader behind a ``ttl``-second cache with local debits (``ttl=0``: no cache)."""

    def __init__(
        self,
        reader: _Reader,
        *,
        clock: Callable[[], float],
        ttl: float = 0.25,
        max_entries: int = 100_000,
        on_error: Callable[[], None] | None = None,
        log_interval: float = 10.0,
    ) -> None:
        self._reader = reader
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._cache: dict[_Key, _Hit] = {}
        self._pending: dict[_Key, asyncio.Task[int | None]] = {}
        self._on_error = on_error
        self._warn = ThrottledLog(clock, log_interval, _log)

    def cached(self, tenant: str, model: str | None, lane: str | None) -> tuple[bool, int | None]:
        hit = self._cache.get((tenant, model, lane))
        if hit is not None and hit.expires > self._clock():
            return True, _left(hit)
        return False, None

    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        key = (tenant, model, lane)
        hit = self._cache.get(key)
        if hit is not None and hit.expires > self._clock():
            return _left(hit)
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(self._read(key))
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(task)

    async def _read(self, key: _Key) -> int | None:
        now = self._clock()
        try:
            value = await self._reader.remaining(*key)
        except _FAILURES as exc:
            if self._on_error is not None:
                self._on_error()
            self._warn.warning(
                "budget read failed (%s: %s); using the last value read", type(exc).__name__, exc
            )
            hit = self._cache.get(key)
            return None if hit is None else _left(hit)
        if self._ttl > 0:
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[key] = _Hit(now + self._ttl, value)
        return value

    async def aclose(self) -> None:
        for task in list(self._pending.values()):
            await stop_task(task, log=_log)

    def note_reserved(self, tenant: str, model: str | None, lane: str | None, tokens: int) -> None:
        hit = self._cache.get((tenant, model, lane))
        if hit is not None and hit.left is not None:
            hit.left -= tokens


def quota_reader_budget(
    redis: Redis,
    policy: Policy,
    *,
    clock: Callable[[], float],
    ttl: float = 0.25,
    on_error: Callable[[], None] | None = None,
) -> Budget:
    """The shared quota reader over ``redis``, behind a cache."""
    return CachedBudget(QuotaReader(redis, policy), clock=clock, ttl=ttl, on_error=on_error)
