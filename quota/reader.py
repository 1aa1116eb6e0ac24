"""QuotaReader: a read-only peek at how many tokens a tenant could reserve right now.

The filter server uses it to clamp ``max_tokens`` to what the budget still holds. One Redis call
(``peek.lua`` on the tenant's hash slot: its live quota fields plus every counter that could
apply); nothing is written. Peeks that arrive while one is out wait and go together in the next
pipeline, so a burst costs a few round trips and no connections of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from redis.exceptions import NoScriptError, RedisError

from policy.model import Policy
from quota.buckets import refill
from quota.config import (
    Limit,
    SubjectQuotas,
    effective_quotas,
    limits_for_tenant,
    tenant_defaults,
)
from quota.errors import QuotaUnavailable
from quota.keys import bucket_key, config_key, window_key
from quota.windows import UNITS, window
from runtime.tasks import stop_task
from wire.jsontypes import JsonObject

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["PEEK_LUA", "QuotaReader", "RedisReply", "WindowUsage", "decode_map", "limit_remaining"]

PEEK_LUA = resources.files("quota").joinpath("peek.lua").read_text()
_PEEK_SHA = hashlib.sha1(PEEK_LUA.encode()).hexdigest()


# What a Redis command (or the peek script) answers: a bulk string, an integer, nil or an array
RedisReply: TypeAlias = "bytes | str | int | list[RedisReply] | None"

_WINDOW_NAMES = {"bucket": "bucket", **{u: f"per_{u}" for u in UNITS}}


@dataclass(frozen=True)
class WindowUsage:
    """One token limit of a tenant now. ``window``: ``bucket``, ``per_minute`` … ``per_month``;
    ``reset_s``: a window's seconds until the next one starts, a bucket's seconds until it is
    full again (None when it does not refill); ``rate``: a bucket's refill per second."""

    window: str
    limit: int
    used: int
    remaining: int
    reset_s: float | None
    rate: float
    quota: str = "tokens"  # or "requests", "usd" (micro-USD), as :meth:`QuotaReader.usage` read
    shadow: bool = False  # counted, never refuses

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "window": self.window,
            "limit": self.limit,
            "used": self.used,
            "remaining": self.remaining,
            "resets_in_s": None if self.reset_s is None else round(self.reset_s, 3),
        }
        if self.window == "bucket":
            out["refill_per_second"] = self.rate
        return out


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_Key = TypeVar("_Key")  # a reply's key type, bytes or str (``Mapping`` is invariant in it)


def decode_map(raw: Mapping[_Key, object] | None) -> dict[str, str]:
    """A Redis hash as text, whichever reply type the client gives."""
    return {_s(k): _s(v) for k, v in (raw or {}).items()}


class QuotaReader:
    """``remaining(tenant, model, lane)``: tokens reservable now across all the tenant's enforced
    token quotas (the minimum, never below 0), or None when no token quota applies. Raises
    ``TimeoutError`` after ``timeout`` seconds and :class:`QuotaUnavailable` when Redis fails."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float | None = 0.05,
    ):
        self._redis = redis
        self._policy = policy
        self._clock = clock
        self._timeout = timeout
        self._waiting: list[tuple[list[str], asyncio.Future[list[RedisReply]]]] = []
        self._running: asyncio.Task[None] | None = None
        self.batches = 0

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
        sq, state = await self._state(tenant, quotas, now_us)
        limits = [
            x
            for x in limits_for_tenant(sq, model, lane)
            if x.tokens and not x.money and not x.shadow
        ]
        if not limits:
            return None
        return max(0, min(limit_remaining(x, state[(x.quota, x.unit)], now_us) for x in limits))

    async def usage(self, tenant: str, quotas: tuple[str, ...] = ("tokens",)) -> list[WindowUsage]:
        """The state now of the tenant-wide ``quotas`` (``tokens``, ``requests``, ``usd``), one
        entry per enforced or shadow limit (each quota's bucket, then minute, hour, day, month
        windows): what this window has spent (a bucket: capacity minus its level), in Redis's
        own accounting, reservations in flight included."""
        now_us = int(self._clock() * 1_000_000)
        sq, state = await self._state(tenant, list(quotas), now_us)
        out = []
        for x in limits_for_tenant(sq, None, None):
            if x.quota not in quotas:
                continue
            raw = state[(x.quota, x.unit)]
            if x.unit == "bucket":
                left = max(0, min(x.limit, limit_remaining(x, raw, now_us)))
                used = x.limit - left
                reset = used / x.rate if x.rate > 0 else None
            else:
                used = int(_s(raw)) if raw is not None else 0
                left = max(0, x.limit - used)
                reset = (window(x.unit, now_us)[1] - now_us) / 1e6
            name = _WINDOW_NAMES[x.unit]
            out.append(WindowUsage(name, x.limit, used, left, reset, x.rate, x.quota, x.shadow))
        return out

    async def _state(
        self, tenant: str, quotas: list[str], now_us: int
    ) -> tuple[SubjectQuotas, dict[tuple[str, str], RedisReply]]:
        """One peek: the tenant's effective quotas and the raw state of each quota's counters."""
        keys = [config_key(tenant)]
        for q in quotas:
            keys.append(bucket_key(tenant, q))
            keys += [window_key(tenant, q, unit, window(unit, now_us)[0]) for unit in UNITS]
        results = await self._peek(keys)
        head = results[0]
        if not isinstance(head, list):
            raise QuotaUnavailable(f"redis: the quota fields came back as {head!r}, not an array")
        fields = dict(zip(head[::2], head[1::2], strict=True))
        sq = effective_quotas(tenant_defaults(self._policy, tenant), decode_map(fields))
        state = {}
        for i, q in enumerate(quotas):
            base = 1 + i * (1 + len(UNITS))
            state[(q, "bucket")] = results[base]
            for j, unit in enumerate(UNITS):
                state[(q, unit)] = results[base + 1 + j]
        return sq, state

    async def _peek(self, keys: list[str]) -> list[RedisReply]:
        fut: asyncio.Future[list[RedisReply]] = asyncio.get_running_loop().create_future()
        self._waiting.append((keys, fut))
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._drain_queue(), name="quota-peek")
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can return the answer and drop
        # a cancel that arrives as it completes (bpo-42130), so a cancelled caller ran on
        async with asyncio.timeout(self._timeout):
            return await asyncio.shield(fut)

    async def _drain_queue(self) -> None:
        """One pipeline per round, for everything that queued up meanwhile."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            self.batches += 1
            try:
                results = await self._run([keys for keys, _ in batch])
            except (RedisError, OSError) as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(QuotaUnavailable(f"redis: {type(exc).__name__}: {exc}"))
                continue
            for (_, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, Exception):
                    fut.set_exception(QuotaUnavailable(f"redis: {res}"))
                elif not isinstance(res, list):
                    fut.set_exception(QuotaUnavailable(f"redis: the peek answered {res!r}"))
                else:
                    fut.set_result(list(res))

    async def _run(self, calls: list[list[str]]) -> list[RedisReply | Exception]:
        results = await self._pipeline(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:  # a restarted or flushed Redis: load the script, then run those again
            await self._redis.script_load(PEEK_LUA)
            again = await self._pipeline([calls[i] for i in missing])
            for i, res in zip(missing, again, strict=True):
                results[i] = res
        return results

    async def _pipeline(self, calls: list[list[str]]) -> list[RedisReply | Exception]:
        pipe = self._redis.pipeline(transaction=False)
        for keys in calls:
            # a plain command: redis-py's cluster pipeline routes EVALSHA by its keys
            pipe.execute_command("EVALSHA", _PEEK_SHA, len(keys), *keys)
        return list(await pipe.execute(raise_on_error=False))

    async def aclose(self) -> None:
        task, self._running = self._running, None
        if task is not None and not task.done():
            await stop_task(task)


def limit_remaining(lim: Limit, raw: object, now_us: int) -> int:
    """What one limit still admits, from its raw Redis state (GET or HMGET tk ts)."""
    if lim.unit != "bucket":
        return lim.limit - (int(_s(raw)) if raw is not None else 0)
    if raw is None or (isinstance(raw, list) and raw and raw[0] is None):
        return lim.limit
    if not isinstance(raw, list) or len(raw) < 2:
        raise QuotaUnavailable(f"redis: a bucket's state is {raw!r}, not [tk, ts]")
    tk, _ = refill(float(_s(raw[0])), int(float(_s(raw[1]))), now_us, lim.limit, lim.rate)
    return math.floor(tk)
