"""The learned output lengths of every filter process, met in Redis.

With several filter processes (workers, replicas, gateways) each sees only some answers (Envoy's
access log stream reaches one of them), so each would learn alone, slower, and reserve
differently for the same tenant. Instead the histograms live in Redis, one hash per (tenant,
model) and window: ``tw:{<tenant>}:olen:<model>:<window>`` (the tenant's hash tag, as every
quota key) and ``tw:{olen:<model>}:pool:<window>`` (the model's pooled lengths), field = bucket,
value = answers. A hash expires three windows after its own began.

Nothing here runs on a request's path. :meth:`SharedLengths.added` and :meth:`wanted` only
note; every ``refresh`` seconds a task of this object writes the answers noted here (one
pipeline of ``HINCRBY``) and then reads the current and previous window of every histogram
reservations asked for since the last round (one pipeline of ``HGETALL``), handing each to
:meth:`filters.output_lengths.OutputLengths.replace`. Redis down or slow: the process keeps
learning from its own answers (the behaviour without sharing), the answers noted meanwhile are
dropped past ``max_pending``, and each failed round is counted by ``on_error`` and logged at most
once per ``log_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from filters.output_lengths import BUCKETS, Key, OutputLengths
from runtime.tasks import stop_task
from runtime.throttled_log import ThrottledLog

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["SharedLengths", "redis_key"]

_log = logging.getLogger(__name__)


def redis_key(key: Key, period: int) -> str:
    tenant, model = key
    if tenant is None:
        return f"tw:{{olen:{model}}}:pool:{period}"
    return f"tw:{{{tenant}}}:olen:{model}:{period}"


def _counts(raw: Mapping[bytes | str, bytes | str]) -> list[int]:
    out = [0] * BUCKETS
    for field, value in raw.items():
        i = int(field)
        if 0 <= i < BUCKETS:
            out[i] = max(0, int(value))
    return out


class SharedLengths:
    """Keeps an :class:`OutputLengths` in step with the histograms in Redis."""

    def __init__(
        self,
        redis: Redis,
        lengths: OutputLengths,
        *,
        clock: Callable[[], float],
        refresh: float = 2.0,
        max_pending: int = 100_000,
        on_error: Callable[[], None] | None = None,
        log_interval: float = 10.0,
    ) -> None:
        self._redis = redis
        self._lengths = lengths
        self._refresh = refresh
        self._max_pending = max_pending
        self._pending: Counter[tuple[str, int]] = Counter()  # (redis key, bucket) → answers
        self._wanted: set[Key] = set()
        self._on_error = on_error
        self._warn = ThrottledLog(clock, log_interval, _log)
        self._task: asyncio.Task[None] | None = None

    # ---- called by OutputLengths (filters.output_lengths.Sharing) --------------------------
    def added(self, key: Key, period: int, bucket: int) -> None:
        if len(self._pending) < self._max_pending:
            self._pending[(redis_key(key, period), bucket)] += 1

    def wanted(self, key: Key) -> None:
        if len(self._wanted) < self._max_pending:
            self._wanted.add(key)

    # ---- the background round ----------------------------------------------------------------
    def start(self) -> SharedLengths:
        """Attach to the model and start the rounds (stopped by :meth:`aclose`); returns self."""
        self._lengths.share(self)
        self._task = asyncio.create_task(self._run(), name="output-lengths-sync")
        return self

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            await self.sync()

    async def sync(self) -> None:
        """One round: write the answers noted here, then read the histograms wanted."""
        pending, self._pending = self._pending, Counter()
        wanted, self._wanted = self._wanted, set()
        ttl = max(1, int(3 * self._lengths.window))
        try:
            if pending:
                pipe = self._redis.pipeline(transaction=False)
                for (name, bucket), n in pending.items():
                    pipe.hincrby(name, str(bucket), n)
                for name in {name for name, _ in pending}:
                    pipe.expire(name, ttl)
                await pipe.execute()
            if not wanted:
                return
            period = self._lengths.period()
            keys = sorted(wanted, key=lambda k: (k[0] or "", k[1]))
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(redis_key(key, period))
                pipe.hgetall(redis_key(key, period - 1))
            got = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            if self._on_error is not None:
                self._on_error()
            self._warn.warning(
                "output lengths not shared this round (%s: %s)", type(exc).__name__, exc
            )
            return
        for i, key in enumerate(keys):
            current, previous = _counts(got[2 * i]), _counts(got[2 * i + 1])
            self._lengths.replace(key, current, previous, period)

    async def aclose(self) -> None:
        self._lengths.share(None)
        if self._task is not None:
            await stop_task(self._task, log=_log)
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self.sync()  # the answers noted since the last round
