"""Where idempotent answers live: Redis (every gateway replica sees them) or memory (tests, one
process). Three atomic operations, each a compare on the exact bytes of the claim:

* ``claim(key, claim, ttl)``: write ``claim`` unless the key has an entry; return that entry
  (bytes) or None when the claim was written.
* ``finish(key, claim, value, ttl)``: replace our claim by the answer (only if it is still ours).
* ``release(key, claim)``: drop our claim (the request failed: a retry may run again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

from filters.plugins.idempotency.errors import StoreUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = ["AnswerStore", "MemoryStore", "RedisStore"]

_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if cur then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
_FINISH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class AnswerStore(Protocol):
    async def claim(self, key: str, claim: bytes, ttl: float) -> bytes | None: ...

    async def finish(self, key: str, claim: bytes, value: bytes, ttl: float) -> bool: ...

    async def release(self, key: str, claim: bytes) -> bool: ...


class RedisStore:
    """The Redis store; every call is bounded by ``timeout`` and raises
    :class:`StoreUnavailable` on any Redis failure."""

    def __init__(self, redis: Redis, *, timeout: float) -> None:
        self._redis = redis
        self._timeout = timeout
        self._claim = redis.register_script(_CLAIM)
        self._finish = redis.register_script(_FINISH)
        self._release = redis.register_script(_RELEASE)

    async def _call(self, script: AsyncScript, key: str, args: list[bytes | int]) -> object:
        try:
            async with asyncio.timeout(self._timeout):
                return await script(keys=[key], args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"idempotency store: {type(exc).__name__}: {exc}") from exc

    async def claim(self, key: str, claim: bytes, ttl: float) -> bytes | None:
        got = await self._call(self._claim, key, [claim, _ms(ttl)])
        return bytes(got) if isinstance(got, bytes | bytearray) and got else None

    async def finish(self, key: str, claim: bytes, value: bytes, ttl: float) -> bool:
        return bool(await self._call(self._finish, key, [claim, value, _ms(ttl)]))

    async def release(self, key: str, claim: bytes) -> bool:
        return bool(await self._call(self._release, key, [claim]))


class MemoryStore:
    """The same operations in one process's memory (no replica sees them): for tests and
    for a filter server without Redis."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._data: dict[str, tuple[bytes, float]] = {}

    def _get(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        if item[1] <= self._clock():
            del self._data[key]
            return None
        return item[0]

    async def claim(self, key: str, claim: bytes, ttl: float) -> bytes | None:
        cur = self._get(key)
        if cur is not None:
            return cur
        self._data[key] = (claim, self._clock() + ttl)
        return None

    async def finish(self, key: str, claim: bytes, value: bytes, ttl: float) -> bool:
        if self._get(key) != claim:
            return False
        self._data[key] = (value, self._clock() + ttl)
        return True

    async def release(self, key: str, claim: bytes) -> bool:
        if self._get(key) != claim:
            return False
        del self._data[key]
        return True


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
