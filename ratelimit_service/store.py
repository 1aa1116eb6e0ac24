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
from typing import Protocol, TypeAlias

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
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
from ratelimit_service.resp import (
    RespArg,
    RespCommand,
    RespConnection,
    RespReply,
    fast_path_url,
)

__all__ = ["MemoryStore", "QuotaStore", "RedisStore", "load_script", "reserve_args"]

log = logging.getLogger(__name__)


def load_script(name: str) -> str:
    return resources.files("ratelimit_service").joinpath(f"lua/{name}.lua").read_text()


class QuotaStore(Protocol):
    """``trace``: a traceparent kept with the reservation record (same call, same TTL) and
    handed back by ``settle``: Envoy's stream-done call carries none (docs/tracing.md)."""

    async def reserve(
        self,
        record: str,
        has_record: bool,
        checks: list[Check],
        now_us: int,
        ttl_ms: int,
        trace: str | None = None,
    ) -> ReserveResult: ...

    async def settle(
        self, record: str, actual: int, now_us: int, actual_usd: int = 0
    ) -> SettleResult: ...


def reserve_args(
    record: str,
    has_record: bool,
    checks: list[Check],
    now_us: int,
    ttl_ms: int,
    trace: str | None = None,
) -> tuple[list[str], list[RespArg]]:
    """KEYS and ARGV of reserve.lua (``trace`` last, only when tracing)."""
    keys = [record]
    args: list[RespArg] = [now_us, ttl_ms, 1 if has_record else 0]
    for c in checks:
        keys.append(c.key)
        args += [
            c.kind,
            c.cost,
            c.limit,
            c.rate,
            c.reset_us,
            (1 if c.shadow else 0) | (2 if c.settle else 0) | (4 if c.money else 0),
        ]
    if trace is not None:
        args.append(trace)
    return keys, args


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _array(raw: RespReply, script: str) -> list[RespReply]:
    if not isinstance(raw, list):
        raise StoreUnavailable(f"redis: {script}.lua answered {raw!r}, not an array")
    return raw


def _int(value: RespReply) -> int:
    if isinstance(value, int | float | str | bytes):
        return int(value)
    raise StoreUnavailable(f"redis: a script answered {value!r} where a number belongs")


def _reserve_result(reply: RespReply) -> ReserveResult:
    raw = _array(reply, "reserve")
    outs = tuple(
        Outcome(bool(raw[i]), _int(raw[i + 1]), _int(raw[i + 2])) for i in range(1, len(raw), 3)
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
        self,
        record: str,
        has_record: bool,
        checks: list[Check],
        now_us: int,
        ttl_ms: int,
        trace: str | None = None,
    ) -> ReserveResult:
        self._calls += 1
        if self._calls % 4096 == 0:
            self.state.purge(now_us)
        rec = record if has_record else None
        return reserve(self.state, rec, checks, now_us, ttl_ms, trace)

    async def settle(
        self, record: str, actual: int, now_us: int, actual_usd: int = 0
    ) -> SettleResult:
        return settle(self.state, record, actual, now_us, actual_usd)


_Entry: TypeAlias = tuple[RespCommand, "asyncio.Future[RespReply]", "asyncio.TimerHandle | None"]


def _expire(fut: asyncio.Future[RespReply]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class RedisStore:
    """Lua on Redis (or Redis Cluster: every call touches one hash tag), EVALSHA with reload on
    NOSCRIPT. Calls that arrive while ``max_inflight`` pipelines are out wait for the next one, so
    under load one round trip carries many decisions. Each call fails with TimeoutError after
    ``deadline`` seconds (one timer per call; no task per call)."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        deadline: float | None = None,
        max_batch: int = 512,
        max_inflight: int = 2,
        observe: Callable[[float, int], None] | None = None,
        fast_url: str | None = None,
    ) -> None:
        self.client = client
        # standalone Redis on plain redis:// (no TLS, no unix socket): batches go over our own
        # pipelined connections (resp.py); a stalled one is dropped after twice the deadline
        self._fast: list[RespConnection] = []
        if (url := fast_path_url(fast_url)) is not None:
            timeout = max(0.1, 2 * deadline) if deadline else 1.0
            self._fast = [RespConnection(url, read_timeout=timeout) for _ in range(max_inflight)]
        self._next_fast = 0
        self.deadline = deadline
        self._observe = observe
        self._scripts = {name: load_script(name) for name in ("reserve", "settle")}
        self._sha = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in self._scripts.items()}
        self._queue: list[_Entry] = []
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._inflight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.calls = 0

    async def reserve(
        self,
        record: str,
        has_record: bool,
        checks: list[Check],
        now_us: int,
        ttl_ms: int,
        trace: str | None = None,
    ) -> ReserveResult:
        keys, args = reserve_args(record, has_record, checks, now_us, ttl_ms, trace)
        raw = await self._call(("EVALSHA", "reserve", len(keys), *keys, *args))
        return _reserve_result(raw)

    async def settle(
        self, record: str, actual: int, now_us: int, actual_usd: int = 0
    ) -> SettleResult:
        raw = _array(
            await self._call(("EVALSHA", "settle", 1, record, now_us, actual, actual_usd)),
            "settle",
        )
        trace = raw[2] if len(raw) > 2 else None
        return SettleResult(bool(raw[0]), _int(raw[1]), _text(trace) if trace else None)

    async def hgetall(self, key: str) -> dict[RespReply, RespReply]:
        raw = await self._call(("HGETALL", key))
        if isinstance(raw, list):  # the RESP fast path: field, value, field, value, ...
            return dict(zip(raw[::2], raw[1::2], strict=True))
        if isinstance(raw, dict):  # redis-py's callback made the dict
            return dict(raw)
        raise StoreUnavailable(f"redis: HGETALL answered {raw!r}, not a hash")

    def _call(self, command: RespCommand) -> asyncio.Future[RespReply]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RespReply] = loop.create_future()
        timer = None if self.deadline is None else loop.call_later(self.deadline, _expire, fut)
        self._queue.append((command, fut, timer))
        if not self._scheduled and self._inflight < self._max_inflight:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _kick(self) -> None:
        if not self._scheduled and self._queue and self._inflight < self._max_inflight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch = [e for e in self._queue[: self._max_batch] if not e[1].done()]
        del self._queue[: self._max_batch]
        if not batch:
            self._kick()
            return
        self._inflight += 1
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._inflight -= 1
        self._kick()

    def _command(self, command: RespCommand) -> RespCommand:
        if command[0] == "EVALSHA":
            return ("EVALSHA", self._sha[str(command[1])], *command[2:])
        return command

    async def _run(self, batch: list[_Entry]) -> None:
        self.batches += 1
        self.calls += len(batch)
        started = time.perf_counter()
        try:
            if self._fast:
                results = await self._run_fast(batch)
            else:
                pipe = self.client.pipeline(transaction=False)
                for command, _, _ in batch:
                    # execute_command: redis-py's cluster pipeline refuses .evalsha() but routes
                    # EVALSHA by its keys (one hash tag per call) when sent as a plain command
                    pipe.execute_command(*self._command(command))
                results = await pipe.execute(raise_on_error=False)
                missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
                if missing:
                    await self._reload(batch, results, missing)
        except Exception as exc:  # the store boundary: every failure becomes StoreUnavailable
            if not isinstance(exc, RedisError | OSError):
                log.error("unexpected error from redis client: %r", exc)
            err = StoreUnavailable(f"redis: {exc.__class__.__name__}: {exc}")
            for _, fut, timer in batch:
                if timer is not None:
                    timer.cancel()
                if not fut.done():
                    fut.set_exception(err)
            return
        if self._observe is not None:
            self._observe(time.perf_counter() - started, len(batch))
        for (_, fut, timer), res in zip(batch, results, strict=True):
            if timer is not None:
                timer.cancel()
            if fut.done():
                continue
            if isinstance(res, Exception):
                fut.set_exception(StoreUnavailable(f"redis: {res}"))
            else:
                fut.set_result(res)

    async def _run_fast(self, batch: list[_Entry]) -> list[RespReply]:
        conn = self._fast[self._next_fast % len(self._fast)]
        self._next_fast += 1
        commands = [self._command(c) for c, _, _ in batch]
        results = await conn.execute(commands)
        missing = [
            i
            for i, r in enumerate(results)
            if isinstance(r, hiredis.ReplyError) and str(r).startswith("NOSCRIPT")
        ]
        if missing:
            log.info("scripts missing in redis (NOSCRIPT): loading them")
            loads = [("SCRIPT", "LOAD", src) for src in self._scripts.values()]
            again = await conn.execute([*loads, *(commands[i] for i in missing)])
            for i, r in zip(missing, again[len(loads) :], strict=True):
                results[i] = r
        return [RedisError(str(r)) if isinstance(r, hiredis.ReplyError) else r for r in results]

    async def _reload(
        self, batch: list[_Entry], results: list[RespReply], missing: list[int]
    ) -> None:
        log.info("scripts missing in redis (NOSCRIPT): loading them")
        for src in self._scripts.values():
            await self.client.script_load(src)
        for i in missing:
            try:
                results[i] = await self.client.execute_command(*self._command(batch[i][0]))
            except RedisError as exc:
                results[i] = exc

    async def aclose(self) -> None:
        for conn in self._fast:
            await conn.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, fut, timer in self._queue:
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.set_exception(StoreUnavailable("store closed"))
        self._queue.clear()
