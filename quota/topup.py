"""Top-ups: a running stream draws more tokens from the limits its reservation charged.

The in-stream stop (docs/quotas.md, "The in-stream stop"): the usage plugin lets a stream run
past its reservation only on tokens it has drawn here, in blocks, and ends the stream when a
top-up is refused. One Lua call (``topup.lua``) on the reservation record's hash slot reads the
record the rate-limit service wrote at admission (``reserve.lua``: each charged counter, a
bucket's burst and rate, a window's limit, money and shadow marks), grants the largest amount up
to the asked block that every enforced limit still holds, charges it to every limit and adds it
to the record, so the stream-done settle compares the real cost with reservation + top-ups.

:func:`topup` is the pure-Python twin (same double arithmetic, ``now`` passed in), over the
rate-limit service's in-memory store (``ratelimit_service.limiter.MemoryState``, read through
the :class:`TwinState` protocol so this layer does not import a service);
``tests/runtime/test_topup_twin.py`` drives both against a real redis-server.
:class:`TopUps` is the filter server's client.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import NoScriptError, RedisError

from quota.buckets import refill
from quota.errors import QuotaUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["NO_RECORD", "TOPUP_LUA", "TopUp", "TopUps", "TwinState", "topup"]

TOPUP_LUA = resources.files("quota").joinpath("topup.lua").read_text()
_TOPUP_SHA = hashlib.sha1(TOPUP_LUA.encode()).hexdigest()

NO_RECORD = -1  # status: no reservation record (no token limit, expired, or Redis was down)


@dataclass(frozen=True, slots=True)
class TopUp:
    """``status`` 1 granted, 0 refused (nothing charged), -1 (:data:`NO_RECORD`)."""

    status: int
    granted: int


class TwinState(Protocol):
    """What the twin needs of ``ratelimit_service.limiter.MemoryState``."""

    records: dict[str, tuple[int, dict[str, list[float]]]]
    windows: dict[str, tuple[int, int]]

    def bucket(self, key: str, cap: int, now_us: int) -> tuple[float, int]: ...

    def put_bucket(self, key: str, tk: float, ts: int, cap: int, rate: float) -> None: ...

    def window(self, key: str, now_us: int) -> int | None: ...


def topup(state: TwinState, record: str, want: int, now_us: int, usd_per_1k: int = 0) -> TopUp:
    """The twin of ``topup.lua``: grant up to ``want`` tokens against ``record``'s limits."""
    item = state.records.get(record)
    if item is None or item[0] <= now_us:
        return TopUp(NO_RECORD, 0)
    grant = want
    seen: list[tuple[str, int, float, int, int]] = []  # key, avail, tk, ts, used
    for key, (_, is_bucket, cap_f, rate, money, shadow) in item[1].items():
        tk, ts, used = 0.0, 0, 0
        if is_bucket:
            tk, ts = refill(*state.bucket(key, int(cap_f), now_us), now_us, int(cap_f), rate)
            avail = math.floor(tk)
        else:
            used = state.window(key, now_us) or 0
            if money:
                avail = (
                    math.floor((int(cap_f) - used) * 1000 / usd_per_1k) if usd_per_1k > 0 else want
                )
            else:
                avail = int(cap_f) - used
        seen.append((key, avail, tk, ts, used))
        if not shadow and avail < grant:
            grant = avail
    if grant < 1:
        return TopUp(0, 0)
    entries = item[1]
    for key, avail, tk, ts, used in seen:
        if avail < grant:
            continue
        entry = entries[key]
        cost = math.ceil(grant * usd_per_1k / 1000) if entry[4] else grant
        if entry[1]:
            state.put_bucket(key, tk - cost, ts, int(entry[2]), entry[3])
        elif key in state.windows and state.window(key, now_us) is not None:
            state.windows[key] = (used + cost, state.windows[key][1])
        else:
            continue
        entry[0] += cost
    return TopUp(1, grant)


class TopUps:
    """``topup.lua`` over the filter server's Redis client: EVALSHA, loaded again on NOSCRIPT,
    each call bounded by ``timeout`` seconds. ``wall``: the wall clock in seconds (the buckets'
    times are the rate-limit service's wall-clock µs). Failures raise :class:`QuotaUnavailable`."""

    def __init__(self, redis: Redis, *, wall: Callable[[], float], timeout: float = 0.1) -> None:
        self._redis = redis
        self._wall = wall
        self._timeout = timeout

    async def topup(self, record: str, want: int, usd_per_1k: int = 0) -> TopUp:
        args = (record, int(self._wall() * 1_000_000), want, usd_per_1k)
        try:
            async with asyncio.timeout(self._timeout):
                try:
                    raw = await self._redis.execute_command("EVALSHA", _TOPUP_SHA, 1, *args)
                except NoScriptError:  # a restarted or flushed Redis
                    await self._redis.script_load(TOPUP_LUA)
                    raw = await self._redis.execute_command("EVALSHA", _TOPUP_SHA, 1, *args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise QuotaUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        return TopUp(int(raw[0]), int(raw[1]))
