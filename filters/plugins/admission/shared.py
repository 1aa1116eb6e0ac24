"""Return promises shared between filter processes, through Redis.

A ``Retry-After`` is a promise (:mod:`filters.plugins.admission.herd`): a client that comes back when
told goes before the fresh arrivals of its lane. The promise is made by the filter process that
shed the client, but the client's next request may reach any other: another filter server of
the same gateway (Envoy spreads ext_proc streams over them), another process of a multi-process
server, another gateway replica. Without sharing, such a client is taken for a fresh arrival
and may be shed again (measured: ``docs/benchmarks.md``, "A promise kept by any filter
process").

So each promise with a key is also written to Redis (``SET``, expiring just after its window),
and a process that sees a keyed request it did not promise, in a lane that would make it wait
(a request that starts at once needs no place), takes the promise there: a Lua script deletes it
and answers "kept" when the claimant's wall clock is inside the window, leaves it when the
client is early, and drops it when it is late. A promise kept where it was made is deleted from
Redis too, so one promise is kept once. A promise kept elsewhere leaves a marker; the process
that made it looks for its open promises' markers every ``POLL_S`` (:meth:`SharedReturns.poll`,
one ``MGET``) and stops counting that client as due back (it came back: the share of returning
clients stays right) or taking it as returning itself.

The key names the pool, the lane and the admission plugin's return key (tenant, body size,
``Idempotency-Key``), hashed: one tenant cannot take another's place. Writes and deletes run in
the background, never on the request's path (at most ``max_pending`` at once; past it they are
dropped and counted); the claim is awaited with a short timeout. Redis down or slow: every
process falls back to its own promises (the behaviour without sharing), counted in
``tokenweir_admission_shared_returns_total{outcome="error"}``.

Times are wall-clock seconds (each process converts from its own monotonic clock), so hosts
need clocks in step to well within the claim window (at least 50 ms early, 1 s late).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from runtime.tasks import stop_task

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["KEPT_PREFIX", "PREFIX", "KeptElsewhere", "SharedReturns", "promise_name"]

log = logging.getLogger("tokenweir.admission")

PREFIX = "tokenweir:return:"
KEPT_PREFIX = "tokenweir:return-kept:"  # + the same digest: set where a promise was kept
LINGER_S = 1.0  # a record outlives its window by this much (then Redis expires it)
POLL_S = 0.25  # how often the maker of open promises looks for the ones kept elsewhere
MAX_TRACKED = 65_536  # promises a process follows (past it, the oldest are left to expire)

# KEYS[1]: the promise, KEYS[2]: its kept marker; ARGV[1]: the claimant's wall clock.
# 1: kept (deleted, the marker set until the window ends); 0: early (left for later), late
# (deleted) or none
_TAKE = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local sep = string.find(v, ' ', 1, true)
local early = tonumber(string.sub(v, 1, sep - 1))
local untl = tonumber(string.sub(v, sep + 1))
local now = tonumber(ARGV[1])
if now < early then return 0 end
redis.call('DEL', KEYS[1])
if now > untl then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', math.max(1, math.floor((untl - now + 1.0) * 1000)))
return 1
"""


def _digest(pool: str, lane: str, key: Hashable) -> str:
    return hashlib.blake2b(repr((pool, lane, key)).encode(), digest_size=16).hexdigest()


def promise_name(pool: str, lane: str, key: Hashable) -> str:
    """The Redis key of a promise: the same in every process for the same client and lane."""
    return PREFIX + _digest(pool, lane, key)


# pool, lane, key → the promise made here was kept by another process
KeptElsewhere = Callable[[str, str, Hashable], None]


class SharedReturns:
    """One filter process's side of the shared promises (module docstring)."""

    def __init__(
        self,
        redis: Redis,
        *,
        wall: Callable[[], float],
        timeout: float = 0.05,
        max_pending: int = 1024,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.redis = redis
        self.wall = wall
        self.timeout = timeout
        self.max_pending = max_pending
        self._take = redis.register_script(_TAKE)
        self._pending: set[asyncio.Task[None]] = set()
        # digest → (pool, lane, key, earliest, latest wall time): promises made here, open or
        # to come, whose keeping elsewhere this process must hear of (``poll``)
        self._made: dict[str, tuple[str, str, Hashable, float, float]] = {}
        self.on_kept: KeptElsewhere | None = None
        self._task: asyncio.Task[None] | None = None
        self.outcomes = Counter(
            "tokenweir_admission_shared_returns",
            "promises shared through Redis: published, kept here for another filter process "
            "(taken), made here and kept by another (kept_elsewhere), looked up in vain "
            "(missed), dropped past the background bound (dropped), Redis errors and timeouts "
            "(error)",
            ["outcome"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        self._logged_at = -float("inf")

    def publish(
        self, pool: str, lane: str, key: Hashable, early_in: float, until_in: float
    ) -> None:
        """A promise made here: claimable from ``early_in`` to ``until_in`` seconds from now."""
        now = self.wall()
        early, until = now + early_in, now + until_in
        ttl_ms = max(1, round((until_in + LINGER_S) * 1000))
        digest = _digest(pool, lane, key)
        made = self._made.get(digest)
        if made is not None and abs(made[4] - until) < 0.001:
            return  # written already (a later shed of this client without a new promise)
        if self._spawn(self.redis.set(PREFIX + digest, f"{early:.3f} {until:.3f}", px=ttl_ms)):
            self.outcomes.labels("published").inc()
            self._made.pop(digest, None)  # (re-inserted last: the dict stays in time order)
            self._made[digest] = (pool, lane, key, early, until)
            while len(self._made) > MAX_TRACKED:
                del self._made[next(iter(self._made))]

    def forget(self, pool: str, lane: str, key: Hashable) -> None:
        """A promise kept here: no other process may keep it again."""
        digest = _digest(pool, lane, key)
        self._made.pop(digest, None)
        self._spawn(self.redis.delete(PREFIX + digest))

    async def poll(self) -> int:
        """Hear of the promises made here that another process kept (their markers), and
        tell ``on_kept``: they are no longer due here, nor claimable. Returns how many."""
        now = self.wall()
        for digest in [d for d, m in self._made.items() if m[4] + POLL_S < now]:
            del self._made[digest]  # its window is over: nobody can keep it any more
        open_now = [d for d, m in self._made.items() if m[3] <= now]
        kept = 0
        for i in range(0, len(open_now), 512):
            chunk = open_now[i : i + 512]
            async with asyncio.timeout(max(self.timeout, 1.0)):
                found = await self.redis.mget([KEPT_PREFIX + d for d in chunk])
            for digest, hit in zip(chunk, found, strict=True):
                made = self._made.pop(digest, None) if hit is not None else None
                if made is not None:
                    kept += 1
                    if self.on_kept is not None:
                        self.on_kept(made[0], made[1], made[2])
        if kept:
            self.outcomes.labels("kept_elsewhere").inc(kept)
        return kept

    def start(self) -> SharedReturns:
        """Start :meth:`run` (stopped by :meth:`aclose`); returns self."""
        self._task = asyncio.create_task(self.run())
        return self

    async def run(self) -> None:
        """``poll`` every ``POLL_S`` while promises are open (:meth:`start`)."""
        while True:
            await asyncio.sleep(POLL_S)
            if self._made:
                try:
                    await self.poll()
                except Exception as e:
                    self._error(e)

    async def take(self, pool: str, lane: str, key: Hashable) -> bool:
        """True when another process promised this client a place now (the promise is kept)."""
        digest = _digest(pool, lane, key)
        try:
            async with asyncio.timeout(self.timeout):
                kept = await self._take(
                    keys=[PREFIX + digest, KEPT_PREFIX + digest], args=[f"{self.wall():.3f}"]
                )
        except Exception as e:
            self._error(e)
            return False
        self.outcomes.labels("taken" if kept else "missed").inc()
        return bool(kept)

    async def aclose(self) -> None:
        """Stop polling and wait (briefly) for the writes still in flight."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=1.0)

    def _spawn(self, op: Awaitable[object]) -> bool:
        if len(self._pending) >= self.max_pending:
            if isinstance(op, Coroutine):  # a redis call: never awaited, closed
                op.close()
            self.outcomes.labels("dropped").inc()
            return False
        task = asyncio.ensure_future(self._guarded(op))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return True

    async def _guarded(self, op: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                await op
        except Exception as e:
            self._error(e)

    def _error(self, e: BaseException) -> None:
        self.outcomes.labels("error").inc()
        now = self.wall()
        if now - self._logged_at >= 60.0:  # the counter says how many, the log why (each minute)
            self._logged_at = now
            log.warning(
                "admission: shared return promises: Redis failed (%r); each filter process "
                "keeps only its own promises meanwhile", e,
            )  # fmt: skip
