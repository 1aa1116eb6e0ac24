"""API keys → tenant (and optionally tier): live in Redis, with the policy file as fallback.

Redis layout (editable live; a value there wins over the policy)::

    tw:key:<sha256 hex of the key>   hash: tenant=<name> [tier=<name>] [lane=<lane>] [disabled=1]
    tw:keys:revoked                  set: the sha256 hex of every revoked key (the tombstones)

Keys are stored hashed, so a Redis dump does not leak them. **Redis is the authority for every
key it has a hash for**: ``disabled=1`` is a tombstone that beats the policy file. A key without
a hash falls back to the policy file.

How answers are kept (``KeyStore``):

* a positive answer is cached ``ttl`` seconds (default 1 s: how long a revocation takes to
  reach every filter server), a negative one ``negative_ttl`` seconds;
* concurrent lookups of one key share one Redis read (single flight: 300 parallel requests with
  the same key are one ``HGETALL``); the read runs in a task of the store, so a client that
  goes away does not cancel it for the others;
* when Redis fails (error, refused connection, or no answer within ``io_timeout``), Redis is
  left alone for ``retry_after`` seconds and the **last answer Redis gave for that key** is
  used, however old; a tombstone (the revoked set, re-read every ``tombstone_sync`` seconds)
  newer than that answer refuses the key, also one this process never read; then the policy
  file answers, once this process has read the revoked set at least once (before that it
  cannot know whether a policy key was revoked); a key neither knows raises :class:`KeyServiceUnavailable` (the
  identity plugin answers 503 + ``retry-after``, never 401). A Redis error therefore never turns
  a revoked key valid or a valid key into 401;
* failures are logged once per ``log_interval`` with the count since the last line, and counted
  by the ``on_redis_error`` and ``on_fallback(answer)`` hooks (metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from redis.exceptions import RedisError

from filters.errors import KeyServiceUnavailable
from policy.model import Policy
from runtime.throttled_log import ThrottledLog

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.typing import EncodableT, FieldT

T = TypeVar("T")

__all__ = [
    "REVOKED_SET",
    "KeyInfo",
    "KeyStore",
    "RedisHashes",
    "key_digest",
    "key_name",
    "policy_keys",
    "revoke_key",
    "set_key",
]

_log = logging.getLogger(__name__)

REVOKED_SET = "tw:keys:revoked"
_FAILURES = (RedisError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    tenant: str
    tier: str | None = None
    lane: str | None = None  # this key's default lane (the tier's allowed_lanes still apply)


class RedisHashes(Protocol):
    """The part of ``redis.asyncio.Redis`` the store uses (a dict-backed fake in tests)."""

    def hgetall(self, name: str) -> Awaitable[Mapping[bytes | str, bytes | str]]: ...

    def smembers(self, name: str) -> Awaitable[Iterable[bytes | str]]: ...


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def key_name(api_key: str) -> str:
    return "tw:key:" + key_digest(api_key)


def policy_keys(policy: Policy) -> dict[str, KeyInfo]:
    """Every key the policy file gives a tenant."""
    out: dict[str, KeyInfo] = {}
    for name, tenant in policy.tenants.items():
        for key in tenant.api_keys:
            out[key] = KeyInfo(tenant=name, tier=tenant.tier)
    return out


async def set_key(
    redis: Redis, api_key: str, tenant: str, tier: str | None = None, lane: str | None = None
) -> None:
    """Give ``api_key`` to ``tenant`` live (admin helper; lifts a revocation)."""
    mapping: dict[FieldT, EncodableT] = {
        "tenant": tenant,
        **({"tier": tier} if tier else {}),
        **({"lane": lane} if lane else {}),
    }
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key_name(api_key))
        pipe.hset(key_name(api_key), mapping=mapping)
        pipe.srem(REVOKED_SET, key_digest(api_key))
        await pipe.execute()


async def revoke_key(redis: Redis, api_key: str) -> None:
    """Disable ``api_key`` live, even when the policy file lists it (a tombstone: kept)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key_name(api_key), mapping={"disabled": "1"})
        pipe.sadd(REVOKED_SET, key_digest(api_key))
        await pipe.execute()


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(slots=True)
class _Entry:
    at: float  # when Redis gave this answer
    expires: float
    info: KeyInfo | None
    knows: bool  # False: Redis has no entry, the policy file (as it is now) answers


class KeyStore:
    """Resolve API keys: Redis first (single flight, cached), last known answers while Redis
    fails, then tombstones, then the policy file. ``aclose()`` stops its reads."""

    def __init__(
        self,
        fallback: Mapping[str, KeyInfo],
        redis: RedisHashes | None,
        *,
        clock: Callable[[], float],
        ttl: float = 1.0,
        negative_ttl: float = 1.0,
        max_entries: int = 100_000,
        on_redis_error: Callable[[], None] | None = None,
        on_fallback: Callable[[str], None] | None = None,
        io_timeout: float = 0.5,
        tombstone_sync: float = 5.0,
        retry_after: float = 1.0,
        log_interval: float = 10.0,
    ) -> None:
        self._fallback = dict(fallback)
        self._redis = redis
        self._clock = clock
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max = max_entries
        self._cache: dict[str, _Entry] = {}  # Redis's answers; expired ones = last known
        self._pending: dict[str, asyncio.Future[KeyInfo | None]] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._on_redis_error = on_redis_error
        self._on_fallback = on_fallback
        self._io_timeout = io_timeout
        self._tombstones: frozenset[str] = frozenset()
        self._tombstones_at = float("-inf")
        self._retry_after = retry_after
        self._down_until = float("-inf")
        self._tombstone_sync = tombstone_sync
        self._next_sync = float("-inf")
        self._syncing = False
        self._warn = ThrottledLog(clock, log_interval, _log)
        self.redis_reads = 0

    def update_fallback(self, fallback: Mapping[str, KeyInfo]) -> None:
        """A new policy file: its keys answer from now on (Redis's answers stay)."""
        self._fallback = dict(fallback)

    async def lookup(self, api_key: str) -> KeyInfo | None:
        """The key's owner, or None (unknown or revoked). Raises :class:`KeyServiceUnavailable`
        when Redis fails and nothing else knows the key."""
        hit = self._cache.get(api_key)
        now = self._clock()
        if hit is not None and hit.expires > now:
            return hit.info if hit.knows else self._fallback.get(api_key)
        if self._redis is None:
            return self._fallback.get(api_key)
        if now < self._down_until:  # Redis just failed: no read until it is retried
            return self._outage_answer(api_key)
        if now >= self._next_sync and not self._syncing:
            self._syncing = True  # before the task runs: one sync, however many lookups
            self._spawn(self.sync_tombstones())
        pending = self._pending.get(api_key)
        if pending is None:
            pending = self._spawn(self._read(api_key))
            self._pending[api_key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(api_key, None))
        return await asyncio.shield(pending)

    def _spawn(self, coro: Coroutine[object, None, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        return task

    async def _read(self, api_key: str) -> KeyInfo | None:
        assert self._redis is not None
        self.redis_reads += 1
        try:
            async with asyncio.timeout(self._io_timeout):
                raw = await self._redis.hgetall(key_name(api_key))
        except _FAILURES as exc:
            self._failed("API key lookup", exc)
            self._down_until = self._clock() + self._retry_after
            return self._outage_answer(api_key)
        info, knows = self._from_redis(api_key, raw)
        ttl = self._ttl if info is not None else self._negative_ttl
        now = self._clock()
        self._down_until = float("-inf")
        self._remember(api_key, _Entry(now, now + ttl, info, knows))
        return info

    def _from_redis(
        self, api_key: str, raw: Mapping[bytes | str, bytes | str]
    ) -> tuple[KeyInfo | None, bool]:
        """Redis's answer, and whether Redis knows the key at all."""
        base = self._fallback.get(api_key)
        if not raw:
            return base, False  # Redis does not know the key: the policy file answers
        fields = {_text(k): _text(v) for k, v in raw.items()}
        if fields.get("disabled", "0") not in ("", "0"):
            return None, True  # a tombstone, also for a key the policy file lists
        tenant = fields.get("tenant")
        if not tenant:
            return base, False
        tier = fields.get("tier") or (base.tier if base is not None else None)
        return KeyInfo(tenant=tenant, tier=tier, lane=fields.get("lane") or None), True

    def _remember(self, api_key: str, entry: _Entry) -> None:
        self._cache.pop(api_key, None)  # re-inserted at the end: the oldest go first
        if len(self._cache) >= self._max:
            self._cache.pop(next(iter(self._cache)))
        self._cache[api_key] = entry

    def _outage_answer(self, api_key: str) -> KeyInfo | None:
        last = self._cache.get(api_key)
        if key_digest(api_key) in self._tombstones and (
            last is None or last.at < self._tombstones_at
        ):
            self._fell_back("tombstone")
            return None
        if last is not None:
            self._fell_back("last_known")
            return last.info if last.knows else self._fallback.get(api_key)
        base = self._fallback.get(api_key)
        if base is not None and self._tombstones_at > float("-inf"):
            self._fell_back("policy")  # not revoked as of the last tombstone read
            return base
        self._fell_back("unavailable")
        raise KeyServiceUnavailable("the API key store (Redis) is unavailable; retry shortly")

    def _fell_back(self, answer: str) -> None:
        if self._on_fallback is not None:
            self._on_fallback(answer)

    def _failed(self, what: str, exc: BaseException) -> None:
        if self._on_redis_error is not None:
            self._on_redis_error()
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self._warn.warning(
            "%s in Redis failed (%s); answering from last known answers, tombstones and the "
            "policy file",
            what,
            reason,
        )

    async def sync_tombstones(self) -> None:
        """Re-read the revoked set (so a revoked policy key stays revoked during an outage even
        in a process that never looked it up); on failure the previous set stays."""
        if self._redis is None:
            return
        self._syncing = True
        self._next_sync = self._clock() + self._tombstone_sync
        try:
            async with asyncio.timeout(max(self._io_timeout, 1.0)):
                members = await self._redis.smembers(REVOKED_SET)
            self._tombstones = frozenset(_text(m) for m in members)
            self._tombstones_at = self._clock()
        except _FAILURES as exc:
            self._failed("reading the revoked keys", exc)
        finally:
            self._syncing = False

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, *_FAILURES, KeyServiceUnavailable):
                await task
        self._tasks.clear()


def _retrieve(fut: asyncio.Future[T]) -> None:
    """Mark a read's outcome as seen (no 'exception was never retrieved' when nobody waits)."""
    if not fut.cancelled():
        fut.exception()
