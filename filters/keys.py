"""API keys → tenant (and optionally tier): live in Redis, with the policy file as fallback.

Redis layout (editable live; a value there wins over the policy)::

    tw:key:<sha256 hex of the key>   hash: tenant=<name> [tier=<name>] [lane=<lane>] [disabled=1]

Keys are stored hashed, so a Redis dump does not leak them. Lookups are cached for ``ttl``
seconds (default 1 s), which bounds how long a revoked key keeps working. A Redis read that takes
longer than ``io_timeout`` (50 ms) counts as a Redis error: the policy file answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["KeyInfo", "KeyStore", "RedisHashes", "key_name", "policy_keys", "revoke_key", "set_key"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    tenant: str
    tier: str | None = None
    lane: str | None = None  # this key's default lane (the tier's allowed_lanes still apply)


class RedisHashes(Protocol):
    """The part of ``redis.asyncio.Redis`` the store uses (a dict-backed fake in tests)."""

    async def hgetall(self, name: str) -> Mapping[Any, Any]: ...


def key_name(api_key: str) -> str:
    return "tw:key:" + hashlib.sha256(api_key.encode()).hexdigest()


def policy_keys(policy: Any) -> dict[str, KeyInfo]:
    """Every key the policy file gives a tenant."""
    out: dict[str, KeyInfo] = {}
    for name, tenant in policy.tenants.items():
        for key in tenant.api_keys:
            out[key] = KeyInfo(tenant=name, tier=tenant.tier)
    return out


async def set_key(
    redis: Any, api_key: str, tenant: str, tier: str | None = None, lane: str | None = None
) -> None:
    """Give ``api_key`` to ``tenant`` live (admin helper)."""
    mapping = {
        "tenant": tenant,
        **({"tier": tier} if tier else {}),
        **({"lane": lane} if lane else {}),
    }
    await redis.delete(key_name(api_key))
    await redis.hset(key_name(api_key), mapping=mapping)


async def revoke_key(redis: Any, api_key: str) -> None:
    """Disable ``api_key`` live, even when the policy file lists it."""
    await redis.hset(key_name(api_key), mapping={"disabled": "1"})


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class KeyStore:
    """Resolve API keys; Redis first, then the policy, with a short cache in front."""

    def __init__(
        self,
        fallback: Mapping[str, KeyInfo],
        redis: RedisHashes | None,
        *,
        clock: Callable[[], float],
        ttl: float = 1.0,
        max_entries: int = 100_000,
        on_redis_error: Callable[[], None] | None = None,
        io_timeout: float = 0.05,
    ) -> None:
        self._fallback = dict(fallback)
        self._redis = redis
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._cache: dict[str, tuple[float, KeyInfo | None]] = {}
        self._on_redis_error = on_redis_error
        self._io_timeout = io_timeout

    async def lookup(self, api_key: str) -> KeyInfo | None:
        now = self._clock()
        hit = self._cache.get(api_key)
        if hit is not None and hit[0] > now:
            return hit[1]
        info = await self._resolve(api_key)
        if len(self._cache) >= self._max:
            self._cache.clear()
        self._cache[api_key] = (now + self._ttl, info)
        return info

    async def _resolve(self, api_key: str) -> KeyInfo | None:
        if self._redis is not None:
            try:
                async with asyncio.timeout(self._io_timeout):
                    raw = await self._redis.hgetall(key_name(api_key))
            except Exception as exc:  # Redis down or slow: the policy file still answers
                _log.warning("API key lookup in Redis failed (%s); using the policy file", exc)
                if self._on_redis_error is not None:
                    self._on_redis_error()
                raw = {}
            if raw:
                fields = {_text(k): _text(v) for k, v in raw.items()}
                if fields.get("disabled", "0") not in ("", "0"):
                    return None
                tenant = fields.get("tenant")
                if tenant:
                    base = self._fallback.get(api_key)
                    tier = fields.get("tier") or (base.tier if base else None)
                    return KeyInfo(tenant=tenant, tier=tier, lane=fields.get("lane") or None)
        return self._fallback.get(api_key)
