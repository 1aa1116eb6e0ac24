"""The one ``/metrics`` server every process runs (control plane, filter server, rate-limit service).

``GET /metrics``: the process's Prometheus registry. ``GET /healthz``: ``200 ok`` while the
process serves, ``503 draining`` once its :class:`~runtime.health.HealthState` reports
NOT_SERVING (a plain-HTTP twin of ``grpc.health.v1.Health``, for probes that speak no gRPC).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from runtime.health import HealthState

__all__ = ["MetricsServer"]


class MetricsServer:
    """``port = await start()`` … ``await aclose()``; port 0 binds a free port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        health: HealthState | None = None,
        routes: Sequence[web.RouteDef] = (),
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.health = health
        self.routes = list(routes)  # more endpoints on this port (the control plane's pool state)
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.add_routes(self.routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        for sock in getattr(site._server, "sockets", None) or ():  # the bound port
            self.port = int(sock.getsockname()[1])
            break
        return self.port

    async def _metrics(self, _request: web.Request) -> web.Response:
        # rendered off the event loop: a large page (many tenants) must not stall the requests
        # this process serves while Prometheus scrapes it
        body = await asyncio.to_thread(generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        if self.health is not None and not self.health.serving:
            return web.Response(status=503, text="draining\n")
        return web.Response(text="ok\n")

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
