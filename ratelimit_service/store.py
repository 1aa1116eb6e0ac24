"""Quota stores: ``RedisStore`` runs the Lua scripts, batching the calls of concurrent requests
into pipelines (one round trip for many decisions); ``MemoryStore`` runs the pure-Python twin
(the local fail-open bucket of one replica). Both answer the same two calls."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError

from ratelimit_service.errors import StoreUnavailable
from ratelimit_service.limiter import (
    Check,
    MemoryState,
    Outcome,
    ReserveResult,
    SettleResult,
    reserve,
    settle,
)

__all__ = ["MemoryStore", "QuotaStore", "RedisStore", "load_script", "reserve_args"]

log = logging.getLogger(__name__)


def load_script(name: str) -> str:
    return resources.files("ratelimit_service").joinpath(f"lua/{name}.lua").read_text()


class QuotaStore(Protocol):
    async def reserve(
        self, record: str, has_record: bool, checks: list[Check], now_us: int, ttl_ms: int
    ) -> ReserveResult: ...

    async def settle(self, record: str, actual: int, now_us: int) -> SettleResult: ...


def reserve_args(
    record: str, has_record: bool, checks: list[Check], now_us: int, ttl_ms: int
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of reserve.lua."""
    keys = [record]
    args: list[Any] = [now_us, ttl_ms, 1 if has_record else 0]
    for c in checks:
        keys.append(c.key)
        args += [
            c.kind,
            c.cost,
            c.limit,
            c.rate,
            c.reset_us,
            (1 if c.shadow else 0) | (2 if c.settle else 0),
        ]
    return keys, args


def _reserve_result(raw: list[Any]) -> ReserveResult:
    outs = tuple(
        Outcome(bool(raw[i]), int(raw[i + 1]), int(raw[i + 2])) for i in range(1, len(raw), 3)
    )
    return ReserveResult(bool(raw[0]), outs)


class MemoryStore:
    """The twin as a store (one replica's local state)."""

    def __init__(self) -> None:
        self.state = MemoryState()
        self._calls = 0

    def has_record(self, record: str) -> bool:
        return record in self.state.records

    async def reserve(
        self, record: str, has_record: bool, checks: list[Check], now_us: int, ttl_ms: int
    ) -> ReserveResult:
        self._calls += 1
        if self._calls % 4096 == 0:
            self.state.purge(now_us)
        return reserve(self.state, record if has_record else None, checks, now_us, ttl_ms)

    async def settle(self, record: str, actual: int, now_us: int) -> SettleResult:
        return settle(self.state, record, actual, now_us)


class RedisStore:
    """Lua on Redis (or Redis Cluster: every call touches one hash tag), EVALSHA with reload on
    NOSCRIPT. Calls that arrive while a pipeline is in flight wait for the next one."""

    def __init__(
        self,
        client: Any,
        *,
        max_batch: int = 512,
        max_inflight: int = 2,
        observe: Callable[[float, int], None] | None = None,
    ) -> None:
        self.client = client
        self._observe = observe
        self._scripts = {name: load_script(name) for name in ("reserve", "settle")}
        self._sha = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in self._scripts.items()}
        self._queue: list[tuple[str, list[str], list[Any], asyncio.Future[Any]]] = []
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._inflight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.calls = 0

    async def reserve(
        self, record: str, has_record: bool, checks: list[Check], now_us: int, ttl_ms: int
    ) -> ReserveResult:
        keys, args = reserve_args(record, has_record, checks, now_us, ttl_ms)
        return _reserve_result(await self._call("reserve", keys, args))

    async def settle(self, record: str, actual: int, now_us: int) -> SettleResult:
        raw = await self._call("settle", [record], [now_us, actual])
        return SettleResult(bool(raw[0]), int(raw[1]))

    def _call(self, name: str, keys: list[str], args: list[Any]) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((name, keys, args, fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        if not self._scheduled and self._queue and self._inflight < self._max_inflight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._queue:
            return
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        self._inflight += 1
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._inflight -= 1
        self._kick()

    async def _run(
        self, batch: list[tuple[str, list[str], list[Any], asyncio.Future[Any]]]
    ) -> None:
        self.batches += 1
        self.calls += len(batch)
        started = time.perf_counter()
        try:
            pipe = self.client.pipeline(transaction=False)
            for name, keys, args, _ in batch:
                # execute_command: redis-py's cluster pipeline refuses .evalsha() but routes
                # EVALSHA by its keys (one hash tag per call) when sent as a plain command
                pipe.execute_command("EVALSHA", self._sha[name], len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                await self._reload(batch, results, missing)
        except Exception as exc:  # the store boundary: every failure becomes StoreUnavailable
            if not isinstance(exc, RedisError | OSError):
                log.error("unexpected error from redis client: %r", exc)
            err = StoreUnavailable(f"redis: {exc.__class__.__name__}: {exc}")
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        if self._observe is not None:
            self._observe(time.perf_counter() - started, len(batch))
        for (*_, fut), res in zip(batch, results, strict=True):
            if fut.done():
                continue
            if isinstance(res, Exception):
                fut.set_exception(StoreUnavailable(f"redis: {res}"))
            else:
                fut.set_result(res)

    async def _reload(self, batch: list[Any], results: list[Any], missing: list[int]) -> None:
        log.info("scripts missing in redis (NOSCRIPT): loading them")
        for name, src in self._scripts.items():
            await self.client.script_load(src)
            self._sha[name] = hashlib.sha1(src.encode()).hexdigest()
        for i in missing:
            name, keys, args, _ = batch[i]
            try:
                results[i] = await self.client.evalsha(self._sha[name], len(keys), *keys, *args)
            except RedisError as exc:
                results[i] = exc

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for *_, fut in self._queue:
            if not fut.done():
                fut.set_exception(StoreUnavailable("store closed"))
        self._queue.clear()
