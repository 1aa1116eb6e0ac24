"""The one ``/metrics`` server every process runs (control plane, filter server, rate-limit service).

``GET /metrics``: the process's Prometheus registry (behind a token off loopback:
:mod:`runtime.admin_auth`). ``GET /healthz``: ``200 ok`` while the
process serves, ``503 draining`` once its :class:`~runtime.health.HealthState` reports
NOT_SERVING (a plain-HTTP twin of ``grpc.health.v1.Health``, for probes that speak no gRPC).

The page is :class:`runtime.metrics_text.TextRenderer`'s (``generate_latest``'s page, byte for
byte, at about half the CPU: it keeps each series' ``name{labels}`` between scrapes), rendered
in a worker thread so that a large page does not stop the event loop outright. The thread still
holds the GIL for the interpreter's switch interval (5 ms by default) each time the loop thread
lets go of it (every socket call), so a request served during a render would wait up to 5 ms per
step: while a render runs the switch interval is lowered (:data:`RENDER_SWITCH_INTERVAL`, the
one found restored when the last render ends). docs/benchmarks.md, "Rendering /metrics beside
the data path", has the numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from runtime.admin_auth import AdminTls, check_exposure, token_middleware
from runtime.gil import SwitchInterval
from runtime.health import HealthState
from runtime.metrics_text import TextRenderer

__all__ = ["RENDER_SWITCH_INTERVAL", "MetricsServer"]

RENDER_SWITCH_INTERVAL = 0.0005  # seconds: the GIL switch interval while a page renders


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
        render_switch_interval: float | None = RENDER_SWITCH_INTERVAL,
        token: str | None = None,
        tls: AdminTls | None = None,
    ) -> None:
        self.registry = registry
        self.renderer = TextRenderer(registry)
        self.host = host
        self.port = port
        self.health = health
        self.routes = list(routes)  # more endpoints on this port (the control plane's pool state)
        self.token = token  # required on every path but /healthz (runtime.admin_auth)
        self.tls = tls  # HTTPS; a verified client certificate stands in for the token
        self._runner: web.AppRunner | None = None
        self._switch = (
            SwitchInterval(render_switch_interval) if render_switch_interval is not None else None
        )

    async def start(self) -> int:
        """Raises :class:`~runtime.admin_auth.AdminAuthError` when bound beyond loopback without
        a token."""
        check_exposure("/metrics", self.host, self.token, self.tls)
        mtls = self.tls is not None and self.tls.client_ca is not None
        guarded = self.token is not None or mtls
        app = web.Application(
            middlewares=[token_middleware(self.token, client_certificates=mtls)] if guarded else []
        )
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.add_routes(self.routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ssl_context = self.tls.server() if self.tls is not None else None
        site = web.TCPSite(runner, self.host, self.port, ssl_context=ssl_context)
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
        # rendered off the event loop (a large page must not stop the requests this process
        # serves), with the GIL handed back to the loop every 0.5 ms rather than every 5 ms
        if self._switch is None:
            body = await asyncio.to_thread(self.renderer.render)
        else:
            with self._switch:
                body = await asyncio.to_thread(self.renderer.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        if self.health is not None and not self.health.serving:
            return web.Response(status=503, text="draining\n")
        return web.Response(text="ok\n")

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
