"""The shadow recorder: where Envoy sends the mirrors the ``shadow`` plugin sampled.

The mirror's cluster is ``tokenweir_shadow`` (ORIGINAL_DST on ``x-tokenweir-shadow-to``, set by
the plugin to this process's recorder), so a mirror always reaches the process that holds its
primary's side. The recorder takes the mirror's body, answers Envoy at once (``202``: Envoy
discards it anyway, and frees the shadow stream), and forwards the request to one of the shadow
pool's endpoints itself, timing the answer (status, time to first byte, end) and reading its
output tokens; then it fills in the pair's shadow side. Only a mirror of an open pair is taken
(its id is a 128-bit token only this process and Envoy saw; anything else gets 404), and only
``shadow.max_inflight`` per route at once (more: a ``dropped`` shadow error). Completed pairs
are counted (:class:`ShadowMetrics`) and written to Redis by one background writer, batched;
when its queue is full a pair is counted, not written. The primary never waits on any of it.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from filters.errors import FiltersError
from filters.plugins.shadow.book import Book, Pending
from filters.plugins.shadow.metrics import ShadowMetrics
from filters.plugins.shadow.scan import UsageScan
from policy.phases import SHADOW_ID_HEADER
from runtime.local_http import serve_any_path
from runtime.shadow import Pair, Side, judge, pairs_key
from runtime.tasks import stop_task
from wire.contract import SHADOW_HEADER_PREFIX

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["ShadowRecorder"]

_log = logging.getLogger(__name__)
_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length"}
)
_SWEEP_S = 0.5
_QUEUE = 2000
_BATCH = 200


class ShadowRecorder:
    def __init__(
        self,
        host: str,
        *,
        metrics: ShadowMetrics,
        redis: Redis | None,
        clock: Callable[[], float],
        wall: Callable[[], float],
        grace: float = 2.0,
    ) -> None:
        self.host, self.metrics, self.redis, self.clock = host, metrics, redis, clock
        self.book = Book(clock, wall, self._pair, grace=grace)
        self.address: str | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[str, int] = {}
        self._forwards: set[asyncio.Task[None]] = set()
        self._queue: asyncio.Queue[tuple[Pair, int, float]] = asyncio.Queue(_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> str:
        try:
            self._runner, port = await serve_any_path(
                self._handle, self.host, client_max_size=256 * 1024**2
            )
        except OSError as exc:
            raise FiltersError(f"shadow recorder cannot listen on {self.host}: {exc}") from exc
        self.address = f"{self.host}:{port}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        self._tasks = [
            asyncio.create_task(self._sweeper(), name="shadow-sweep"),
            asyncio.create_task(self._writer(), name="shadow-writer"),
        ]
        return self.address

    async def aclose(self) -> None:
        for t in self._tasks:
            await stop_task(t, log=_log)
        self._tasks.clear()
        for t in list(self._forwards):
            await stop_task(t, log=_log)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- mirrors in ---------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        pending = self.book.claim(request.headers.get(SHADOW_ID_HEADER, ""))
        if pending is None:
            self.metrics.dropped.labels("unknown_mirror").inc()
            return web.Response(status=404, text="no open shadow pair of that id")
        route = pending.route
        if self._inflight.get(route, 0) >= pending.max_inflight:
            self.book.shadow(pending.id, Side(error="dropped"))
            return web.Response(status=503, text="shadow requests of this route at their bound")
        headers = {
            k: v for k, v in request.headers.items()
            if k.lower() not in _HOP and not k.lower().startswith(SHADOW_HEADER_PREFIX)
        }  # fmt: skip
        self._inflight[route] = self._inflight.get(route, 0) + 1
        task = asyncio.create_task(
            self._forward(pending, request.method, request.path_qs, headers, body),
            name="shadow-forward",
        )
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)
        return web.Response(status=202)

    async def _forward(
        self, p: Pending, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> None:
        start = self.clock()
        status, ttft, complete, error = 0, None, False, None
        scan = UsageScan("")
        endpoint = p.endpoints[zlib.crc32(p.id.encode()) % len(p.endpoints)]
        try:
            assert self._session is not None
            async with asyncio.timeout(p.timeout):
                async with self._session.request(
                    method, f"http://{endpoint}{path}", headers=headers, data=body
                ) as resp:
                    status = resp.status
                    scan = UsageScan(resp.headers.get("content-type", ""))
                    async for chunk in resp.content.iter_any():
                        if ttft is None and chunk:
                            ttft = self.clock() - start
                        scan.feed(chunk)
                    complete = True
        except TimeoutError:
            error = "timeout"
        except (aiohttp.ClientError, OSError):
            error = "cut" if status else "connect"
        finally:
            self._inflight[p.route] = max(0, self._inflight.get(p.route, 1) - 1)
        tokens = scan.done() if complete else None
        self.book.shadow(p.id, judge(status, complete, tokens, error, ttft, self.clock() - start))

    # -- pairs out ----------------------------------------------------------------------------
    def _pair(self, pair: Pair, pending: Pending) -> None:
        self.metrics.pair(pair)
        if self.redis is None:
            return
        try:
            self._queue.put_nowait((pair, pending.keep, pending.ttl))
        except asyncio.QueueFull:
            self.metrics.dropped.labels("store_queue_full").inc()

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_S)
            before = self.book.dropped
            self.book.sweep()
            if self.book.dropped > before:
                self.metrics.dropped.labels("not_mirrored_or_stale").inc(self.book.dropped - before)

    async def _writer(self) -> None:
        redis = self.redis
        if redis is None:  # nothing is queued without Redis (_pair)
            return
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                pipe = redis.pipeline(transaction=False)
                for pair, keep, ttl in batch:
                    key = pairs_key(pair.route)
                    pipe.lpush(key, pair.encode())
                    pipe.ltrim(key, 0, keep - 1)
                    pipe.expire(key, max(1, int(ttl)))
                await pipe.execute()
            except Exception as exc:  # Redis down: the pairs are counted, not stored; next batch
                self.metrics.dropped.labels("store_error").inc(len(batch))
                _log.warning("shadow pairs not stored (%d): %s", len(batch), exc)
                await asyncio.sleep(1.0)
