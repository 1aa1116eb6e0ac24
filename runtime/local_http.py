"""A small aiohttp server that answers every method and path with one handler, on a port the
kernel picks: the filter server's side endpoints (collapsing's fan-out, the shadow recorder)
that Envoy reaches by an address the process announces."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["serve_any_path"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_any_path(
    handler: Handler, host: str, *, client_max_size: int = 1024**2
) -> tuple[web.AppRunner, int]:
    """Serve ``handler`` for every request on ``host`` at a free port; the runner (to clean up)
    and the port. Raises OSError when it cannot listen (nothing is left running then)."""
    app = web.Application(client_max_size=client_max_size)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    server = site._server
    assert server is not None
    port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]  # aiohttp types the server as asyncio's base Server; a TCP server has sockets
    return runner, port
