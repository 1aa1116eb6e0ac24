"""The fan-out endpoint: where Envoy sends a follower of a collapsed request.

The collapse plugin points a follower at this endpoint (an ORIGINAL_DST cluster on the header
``x-tokenweir-collapse-to``, set only by the filter server) with the run's id in
``x-tokenweir-collapse-id``. The answer is the leader's: its status and content type, then
every chunk of its body from the first, each written as soon as the leader's response passes
the filter. A leader cut off mid-stream ends the follower's SSE stream with an error event
(a JSON answer is cut, as the leader's was). Listens on the filter server's host, on a port
the kernel picks when it binds (the plugin names that port in the header itself, so nothing
else has to know it in advance and no other process can take it first).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from controlplane.policy.phases import COLLAPSE_ID_HEADER
from filters.collapse.errors import CollapseError
from filters.collapse.hub import Hub, Run

__all__ = ["FanoutServer"]

_log = logging.getLogger(__name__)
_CUT = {
    "error": {
        "message": "the shared backend answer this request joined was cut off; retry",
        "type": "server_error",
        "code": "collapsed_leader_failed",
    }
}


class FanoutServer:
    def __init__(self, hub: Hub, host: str, *, idle_timeout: float) -> None:
        self.hub = hub
        self.host = host
        self.idle_timeout = idle_timeout
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> str:
        """Bind and serve; returns ``host:port`` (also set as the hub's address)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        try:
            await site.start()
        except OSError as exc:
            raise CollapseError(f"fan-out endpoint cannot listen on {self.host}: {exc}") from exc
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.hub.address = f"{self.host}:{self.port}"
        return self.hub.address

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        run = self.hub.attach(request.headers.get(COLLAPSE_ID_HEADER, ""))
        if run is None:
            return _gone()
        try:
            return await self._stream(request, run)
        finally:
            self.hub.detach(run)

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
        if not run.complete:
            if not run.content_type.startswith("text/event-stream"):
                if request.transport is not None:
                    request.transport.close()  # the client sees the cut, as the leader's did
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
