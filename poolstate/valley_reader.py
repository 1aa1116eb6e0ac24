"""The batch runners' words on some pools, read from Redis in the background
(poolstate/valley.py: what runners write, and why the degradation ladder and the online planner
leave their lines out).

One pipelined ``HGETALL`` per round for the pools it is told (:meth:`ValleyReader.configure`),
every ``every`` seconds. A round that fails (Redis down or slow) is counted and logged
(throttled); after ``MAX_AGE_S`` without a good round every pool reads no runner at all, so a
reader counts the whole pool as before: the safe side.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from poolstate.valley import MAX_AGE_S, PUBLISH_EVERY_S, RunnerWord, fresh_words, valley_key
from runtime.redis_connect import RedisAuthError
from runtime.tasks import stop_task
from runtime.throttled_log import ThrottledLog

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["ValleyReader"]

_log = logging.getLogger("tokenweir.valley")

Client = Callable[[], Awaitable["Redis | RedisCluster | None"]]  # None: no Redis configured


class ValleyReader:
    def __init__(
        self,
        client: Client,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_error: Callable[[], None] | None = None,
        every: float = PUBLISH_EVERY_S,
    ) -> None:
        self._client = client
        self._clock = clock
        self._wall = wall
        self._on_error = on_error
        self._every = every
        self.pools: tuple[str, ...] = ()
        self._words: dict[str, dict[str, RunnerWord]] = {}
        self._read_at = -math.inf  # the last round that read every pool
        self._warn = ThrottledLog(clock, 10.0, _log)
        self._task: asyncio.Task[None] | None = None

    def configure(self, pools: tuple[str, ...]) -> None:
        self.pools = pools

    def words(self, pool: str) -> Mapping[str, RunnerWord]:
        """Runner replica → its fresh word on ``pool`` as last read (empty: none, not asked
        for, or no good read for ``MAX_AGE_S``)."""
        if self._clock() - self._read_at > MAX_AGE_S:
            return {}
        return self._words.get(pool, {})

    def lines(self, pool: str) -> int:
        """The runners' lines at ``pool``'s replicas (0 as for :meth:`words`)."""
        return sum(w.lines for w in self.words(pool).values())

    def start(self) -> ValleyReader:
        self._task = asyncio.create_task(self._run(), name="valley-reader")
        return self

    async def _run(self) -> None:
        while True:
            await self.read()
            await asyncio.sleep(self._every)

    async def read(self) -> None:
        """One round: every pool's hash."""
        pools = self.pools
        if not pools:
            self._words = {}
            return
        try:
            redis = await self._client()
            if redis is None:
                return
            pipe = redis.pipeline(transaction=False)
            for pool in pools:
                pipe.hgetall(valley_key(pool))
            got = await pipe.execute()
        except (RedisError, RedisAuthError, OSError, TimeoutError) as exc:
            if self._on_error is not None:
                self._on_error()
            self._warn.warning(
                "the batch runners' lines were not read (%s: %s); their pools are read whole "
                "after %.0f s", type(exc).__name__, exc, MAX_AGE_S,
            )  # fmt: skip
            return
        now = self._wall()
        self._words = {pool: fresh_words(f, now) for pool, f in zip(pools, got, strict=True)}
        self._read_at = self._clock()

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task, log=_log)
            self._task = None
