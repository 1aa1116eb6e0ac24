"""The fan-out endpoint: where Envoy sends every caller of a collapsed request, leader included.

The collapse plugin points each caller at this endpoint (an ORIGINAL_DST cluster on the header
``x-tokenweir-collapse-to``, set only by the filter server) with the run's id in
``x-tokenweir-collapse-id``. The first caller to arrive starts the run's *origin*: this endpoint
sends the backend request itself, straight to one of the pool's replicas (the next one when a
replica refuses the connection), and appends each chunk of the answer to the run as it comes.
Every caller gets the answer's status and content type, then every chunk from the first. The
origin belongs to the run, not to a caller: a caller that goes away closes only its own stream,
and the origin is cancelled only when no caller is left (``Hub.on_idle``). An origin cut off
mid-stream ends each caller's SSE stream with an error event (a JSON answer is cut, as it was).
Listens on the filter server's host, on a port the kernel picks (the plugin names it in the
header itself, so no other process can take it first).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from filters.plugins.collapse.errors import CollapseError
from filters.plugins.collapse.hub import Hub, Origin, Run, registry_key
from policy.phases import COLLAPSE_ID_HEADER
from runtime.local_http import serve_any_path
from runtime.tasks import stop_task

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["FanoutServer"]

_log = logging.getLogger(__name__)
# delete the registry entry only while it still names this run
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"
_CUT = {
    "error": {
        "message": "the shared backend answer this request joined was cut off; retry",
        "type": "server_error",
        "code": "collapsed_leader_failed",
    }
}


class FanoutServer:
    def __init__(
        self,
        hub: Hub,
        host: str,
        *,
        idle_timeout: float,
        max_buffer_bytes: int = 4 * 1024**2,
        redis: Redis | None = None,
    ) -> None:
        self.hub = hub
        self.host = host
        self.idle_timeout = idle_timeout
        self.max_buffer_bytes = max_buffer_bytes
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._origins: dict[str, asyncio.Task[None]] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self.redis = redis
        self.port = 0
        hub.on_idle, hub.on_finish = self._cancel, self._unpublish

    async def start(self) -> str:
        """Bind and serve; returns ``host:port`` (also set as the hub's address)."""
        try:
            self._runner, self.port = await serve_any_path(self._handle, self.host)
        except OSError as exc:
            raise CollapseError(f"fan-out endpoint cannot listen on {self.host}: {exc}") from exc
        timeout = aiohttp.ClientTimeout(connect=5.0, sock_read=self.idle_timeout)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=timeout, auto_decompress=False
        )
        self.hub.address = f"{self.host}:{self.port}"
        return self.hub.address

    async def aclose(self) -> None:
        for task in [*self._origins.values(), *self._releases]:
            await stop_task(task, log=_log)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _unpublish(self, run: Run) -> None:
        """The run ended: other filter processes must not find it any more (Redis)."""
        run.published = False
        if self.redis is None:
            return
        task = asyncio.create_task(self._release(self.redis, run), name="collapse-unpublish")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, redis: Redis, run: Run) -> None:
        try:
            key = registry_key(run.key)
            await redis.eval(_RELEASE, 1, key, f"{self.hub.address} {run.id}")
        except Exception as exc:  # the entry expires on its own (collapsing.follower_timeout)
            _log.warning("collapsed run %s not unpublished: %s", run.id, exc)

    def _ended(self, run_id: str, _task: asyncio.Task[None]) -> None:
        self._origins.pop(run_id, None)

    def _cancel(self, run: Run) -> None:
        task = self._origins.pop(run.id, None)
        if task is not None:
            task.cancel()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        run = self.hub.attach(request.headers.get(COLLAPSE_ID_HEADER, ""))
        if run is None:
            return _gone()
        try:
            if not run.started and not run.done and run.origin is not None:
                run.started = True
                task = asyncio.create_task(self._origin(run), name="collapse-origin")
                self._origins[run.id] = task
                task.add_done_callback(functools.partial(self._ended, run.id))
            return await self._stream(request, run)
        finally:
            self.hub.detach(run)

    async def _origin(self, run: Run) -> None:
        """The run's backend request; every outcome ends the run (cancelled: as cut)."""
        o = run.origin
        assert o is not None
        try:
            if not await self._send(run, o) and o.fallback is not None:
                # the other filter process's run was gone: ask the pool ourselves
                await self._send(run, o.fallback)
            self.hub.finish(run, complete=True)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            _log.warning("collapsed run %s cut: %s", run.id, exc)
            if not run.status:
                run.headers(502, "application/json")
                run.feed(json.dumps(_CUT).encode(), limit=self.max_buffer_bytes)
                self.hub.finish(run, complete=True)
        finally:
            self.hub.finish(run, complete=False)  # a no-op when it already ended

    async def _send(self, run: Run, o: Origin) -> bool:
        """Stream ``o``'s answer into the run; False (nothing fed) when ``o`` reads another
        process's run that is gone or unreachable, so the caller may fall back."""
        assert self._session is not None
        for i, endpoint in enumerate(o.endpoints):
            try:
                async with self._session.request(
                    o.method, f"http://{endpoint}{o.path}", headers=list(o.headers), data=o.body
                ) as resp:
                    if o.fallback is not None and resp.status == 503:
                        return False  # collapsed_run_gone
                    run.headers(resp.status, resp.headers.get("content-type", ""))
                    async for chunk in resp.content.iter_any():
                        run.feed(chunk, limit=self.max_buffer_bytes)
                return True
            except aiohttp.ClientConnectorError as exc:  # refused: the next replica
                _log.warning("collapsed run %s: %s refused (%s)", run.id, endpoint, exc)
                if o.fallback is not None:
                    return False
                if i == len(o.endpoints) - 1:
                    raise
        return True

    async def _stream(self, request: web.Request, run: Run) -> web.StreamResponse:
        try:
            started = await run.wait_headers(self.idle_timeout)
        except TimeoutError:
            started = False
        if not started:
            return _gone()
        resp = web.StreamResponse(status=run.status)
        resp.content_type = run.content_type.split(";")[0] or "application/octet-stream"
        await resp.prepare(request)
        try:
            async for chunk in run.follow(self.idle_timeout):
                await resp.write(chunk)
        except TimeoutError:
            _log.warning("collapsed run %s sent nothing for %.0fs", run.id, self.idle_timeout)
        except ConnectionResetError:  # this caller left; the run goes on for the others
            return resp
        if not run.complete:
            if not run.content_type.startswith("text/event-stream"):
                if request.transport is not None:
                    request.transport.close()  # the client sees the cut, as the origin's was
                return resp
            await resp.write(b"data: " + json.dumps(_CUT).encode() + b"\n\n")
        await resp.write_eof()
        return resp


def _gone() -> web.Response:
    body = {
        "error": {
            "message": "the request this one joined is no longer running; retry",
            "type": "server_error",
            "code": "collapsed_run_gone",
        }
    }
    return web.json_response(body, status=503, headers={"retry-after": "1"})
