"""Where idempotent answers live: Redis (every gateway replica sees them) or memory (tests, one
process). Atomic operations, each a compare on the exact bytes of the claim. A claim has a
*lease* beside it (``<key>:lease``, the same Redis Cluster slot) that its holder renews while
its request runs; a claim whose lease lapsed has a dead holder. ``<key>:answered`` marks a
claim whose backend answer had begun to come back.

* ``claim(key, claim, ttl, lease)``: write ``claim`` (and its lease) unless the key has an
  entry; return None when written, else that entry (bytes) and whether its holder's lease
  still runs.
* ``renew(key, claim, lease)``: extend the lease of our claim (False: it is no longer ours).
* ``take_over(key, old, claim, ttl, lease)``: replace a dead holder's claim ``old`` by ours
  (only if it is still ``old`` and its lease lapsed).
* ``mark_answered(key, claim, ttl)``: note that our claim's backend request answered.
* ``finish(key, claim, value, ttl)``: replace our claim by the answer (only if it is still ours).
* ``release(key, claim)``: drop our claim (the request failed: a retry may run again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

from filters.plugins.idempotency.errors import StoreUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = ["AnswerStore", "Claimed", "MemoryStore", "RedisStore", "answered_key", "lease_key"]

# KEYS: the entry, its lease, its answered mark. Each script leaves the lease and the mark only
# beside a claim being held.
_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if cur then return {cur, redis.call('EXISTS', KEYS[2]), redis.call('EXISTS', KEYS[3])} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
return false
"""
_MARK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  return 1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return 1
end
return 0
"""
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  redis.call('DEL', KEYS[3])
  return 1
end
return 0
"""
_FINISH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[2], KEYS[3])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return 1
end
return 0
"""


def lease_key(key: str) -> str:
    return key + ":lease"


def answered_key(key: str) -> str:
    return key + ":answered"


@dataclass(frozen=True, slots=True)
class Claimed:
    """The entry a claim found in its place, whether its holder's lease still runs and
    whether its backend request had answered."""

    entry: bytes
    holder_alive: bool
    answered: bool = False


class AnswerStore(Protocol):
    async def claim(self, key: str, claim: bytes, ttl: float, lease: float) -> Claimed | None: ...

    async def renew(self, key: str, claim: bytes, lease: float) -> bool: ...

    async def take_over(
        self, key: str, old: bytes, claim: bytes, ttl: float, lease: float
    ) -> bool: ...

    async def mark_answered(self, key: str, claim: bytes, ttl: float) -> bool: ...

    async def finish(self, key: str, claim: bytes, value: bytes, ttl: float) -> bool: ...

    async def release(self, key: str, claim: bytes) -> bool: ...


class RedisStore:
    """The Redis store; every call is bounded by ``timeout`` and raises
    :class:`StoreUnavailable` on any Redis failure."""

    def __init__(self, redis: Redis, *, timeout: float) -> None:
        self._redis = redis
        self._timeout = timeout
        self._claim = redis.register_script(_CLAIM)
        self._renew = redis.register_script(_RENEW)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._mark = redis.register_script(_MARK)
        self._finish = redis.register_script(_FINISH)
        self._release = redis.register_script(_RELEASE)

    async def _call(self, script: AsyncScript, key: str, args: list[bytes | int]) -> object:
        try:
            async with asyncio.timeout(self._timeout):
                return await script(keys=[key, lease_key(key), answered_key(key)], args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"idempotency store: {type(exc).__name__}: {exc}") from exc

    async def claim(self, key: str, claim: bytes, ttl: float, lease: float) -> Claimed | None:
        got = await self._call(self._claim, key, [claim, _ms(ttl), _ms(lease)])
        if not got:
            return None
        if not (
            isinstance(got, list)
            and len(got) == 3
            and isinstance(got[0], bytes | bytearray)
            and isinstance(got[1], int)
            and isinstance(got[2], int)
        ):
            raise StoreUnavailable(f"idempotency store: a claim answered {got!r}")
        return Claimed(bytes(got[0]), bool(got[1]), bool(got[2]))

    async def renew(self, key: str, claim: bytes, lease: float) -> bool:
        return bool(await self._call(self._renew, key, [claim, _ms(lease)]))

    async def take_over(self, key: str, old: bytes, claim: bytes, ttl: float, lease: float) -> bool:
        args: list[bytes | int] = [old, claim, _ms(ttl), _ms(lease)]
        return bool(await self._call(self._take_over, key, args))

    async def mark_answered(self, key: str, claim: bytes, ttl: float) -> bool:
        return bool(await self._call(self._mark, key, [claim, _ms(ttl)]))

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

    def _set(self, key: str, value: bytes, ttl: float) -> None:
        self._data[key] = (value, self._clock() + ttl)

    async def claim(self, key: str, claim: bytes, ttl: float, lease: float) -> Claimed | None:
        cur = self._get(key)
        if cur is not None:
            alive = self._get(lease_key(key)) is not None
            return Claimed(cur, alive, self._get(answered_key(key)) is not None)
        self._set(key, claim, ttl)
        self._set(lease_key(key), b"1", lease)
        return None

    async def renew(self, key: str, claim: bytes, lease: float) -> bool:
        if self._get(key) != claim:
            return False
        self._set(lease_key(key), b"1", lease)
        return True

    async def take_over(self, key: str, old: bytes, claim: bytes, ttl: float, lease: float) -> bool:
        if self._get(key) != old or self._get(lease_key(key)) is not None:
            return False
        self._set(key, claim, ttl)
        self._set(lease_key(key), b"1", lease)
        self._data.pop(answered_key(key), None)
        return True

    async def mark_answered(self, key: str, claim: bytes, ttl: float) -> bool:
        if self._get(key) != claim:
            return False
        self._set(answered_key(key), b"1", ttl)
        return True

    async def finish(self, key: str, claim: bytes, value: bytes, ttl: float) -> bool:
        if self._get(key) != claim:
            return False
        self._set(key, value, ttl)
        self._data.pop(lease_key(key), None)
        self._data.pop(answered_key(key), None)
        return True

    async def release(self, key: str, claim: bytes) -> bool:
        if self._get(key) != claim:
            return False
        for k in (key, lease_key(key), answered_key(key)):
            self._data.pop(k, None)
        return True


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
