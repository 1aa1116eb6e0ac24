"""QuotaReader: a read-only peek at how many tokens a tenant could reserve right now.

The filter server uses it to clamp ``max_tokens`` to what the budget still holds. One Redis call
(``lua/peek.lua`` on the tenant's hash slot: its live quota fields plus every counter that could
apply); nothing is written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from controlplane.policy.model import Policy
from ratelimit_service.config import Limit, effective_quotas, limits_for_tenant, tenant_defaults
from ratelimit_service.keys import bucket_key, config_key, window_key
from ratelimit_service.limiter import refill
from ratelimit_service.store import RedisStore
from ratelimit_service.windows import UNITS, window

__all__ = ["QuotaReader", "decode_map", "limit_remaining"]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_map(raw: Any) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in (raw or {}).items()}


class QuotaReader:
    """``remaining(tenant, model, lane)``: tokens reservable now across all the tenant's enforced
    token quotas (the minimum, never below 0), or None when no token quota applies. Raises
    ``TimeoutError`` after ``timeout`` seconds and ``StoreUnavailable`` when Redis fails."""

    def __init__(
        self,
        redis: Any,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float | None = 0.05,
    ):
        self._redis = redis
        self._policy = policy
        self._clock = clock
        # one EVALSHA per peek; concurrent peeks share one pipeline (no connections of its own)
        self._store = RedisStore(redis, deadline=timeout)

    def update_policy(self, policy: Policy) -> None:
        self._policy = policy

    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        now_us = int(self._clock() * 1_000_000)
        quotas = ["tokens"]
        if model is not None:
            quotas.append(f"models.{model}")
        if lane is not None:
            quotas.append(f"lanes.{lane}")
        keys = [config_key(tenant)]
        for q in quotas:
            keys.append(bucket_key(tenant, q))
            keys += [window_key(tenant, q, unit, window(unit, now_us)[0]) for unit in UNITS]
        results = await self._store.peek(keys)
        results[0] = dict(zip(results[0][::2], results[0][1::2], strict=True))
        sq = effective_quotas(tenant_defaults(self._policy, tenant), decode_map(results[0]))
        limits = [x for x in limits_for_tenant(sq, model, lane) if x.tokens and not x.shadow]
        if not limits:
            return None
        state = {}
        for i, q in enumerate(quotas):
            base = 1 + i * (1 + len(UNITS))
            state[(q, "bucket")] = results[base]
            for j, unit in enumerate(UNITS):
                state[(q, unit)] = results[base + 1 + j]
        return max(0, min(limit_remaining(x, state[(x.quota, x.unit)], now_us) for x in limits))


def limit_remaining(lim: Limit, raw: Any, now_us: int) -> int:
    """What one limit still admits, from its raw Redis state (GET or HMGET tk ts)."""
    if lim.unit != "bucket":
        return lim.limit - (int(_s(raw)) if raw is not None else 0)
    if raw is None or raw[0] is None:
        return lim.limit
    tk, _ = refill(float(_s(raw[0])), int(float(_s(raw[1]))), now_us, lim.limit, lim.rate)
    return math.floor(tk)
