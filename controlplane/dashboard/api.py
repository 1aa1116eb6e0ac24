"""The dashboard's HTTP side, on the control plane's metrics address (docs/api.md).

``GET /dashboard/`` the page (plain HTML + JS from this package, nothing fetched elsewhere);
``GET /api/v1/overview`` everything the page shows as one JSON document: pools and replicas
(the pool state), lanes, tenants, the xDS view of every connected Envoy, the collector's
sources, and chart points. Bad query values are 400 with an OpenAI-style error body.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TypedDict

from aiohttp import web

from controlplane.dashboard.batch import BatchPanel, batch_panel, batch_sources
from controlplane.dashboard.collector import MetricsSource, ServiceCollector
from controlplane.dashboard.pools import PoolRow, pool_rows
from controlplane.dashboard.quota import QuotaWindows
from controlplane.dashboard.view import (
    LaneRow,
    TenantRow,
    envoy_sources,
    lane_rows,
    recent_rejections,
    sources_from_policy,
    tenant_rows,
    with_windows,
)
from controlplane.xds.status import NodeStatus
from policy import Policy
from wire.jsontypes import JsonObject

__all__ = ["OVERVIEW_PATH", "Dashboard", "Overview"]

OVERVIEW_PATH = "/api/v1/overview"
# 2: tenants' budgets windowed from Redis, since-start totals apart; 3: lanes' `shed` counts the
# ladder's sheds too, `pool_status`, tenants' `binding` and `recent_429`, `since`
API_VERSION = 3
MAX_POINTS = 3600  # chart points one answer may carry (the history holds HISTORY_S / interval)
_STATIC = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


class Overview(TypedDict):
    """The answer of ``GET /api/v1/overview`` (docs/api.md)."""

    api_version: int
    time: float
    interval_s: float
    pools: JsonObject  # the pool state (``poolstate``)
    pool_status: list[PoolRow]
    lanes: list[LaneRow]
    tenants: list[TenantRow]
    quota_source: str | None
    quota_error: str | None
    tenant_count: int
    rejections: dict[str, int]
    decisions: dict[str, int]
    envoys: list[NodeStatus]
    sources: list[dict[str, object]]
    batch: BatchPanel | None
    series: list[dict[str, float | None]]


def _bad(message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": 400}}
    return web.json_response(body, status=400)


def _int_arg(q: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = q.get(name)
    if raw is None:
        return default
    value = int(raw)  # ValueError: the caller answers 400
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be within {lo}..{hi}")
    return value


def _float_arg(q: Mapping[str, str], name: str) -> float | None:
    raw = q.get(name)
    if raw is None:
        return None
    value = float(raw)  # ValueError: the caller answers 400
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number")
    return value


class Dashboard:
    """Owns the service collector; ``pools`` and ``nodes`` read the control plane's state."""

    def __init__(
        self,
        fetch: MetricsSource,
        *,
        pools: Callable[[], JsonObject],
        nodes: Callable[[], list[NodeStatus]],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        interval: float = 1.0,
        quotas: QuotaWindows | None = None,
    ) -> None:
        self.collector = ServiceCollector(
            fetch, clock=wall_clock, interval=interval, more=lambda: envoy_sources(nodes())
        )
        self.quotas = quotas or QuotaWindows(None)
        self._pools = pools
        self._nodes = nodes
        self._clock = clock
        self._wall = wall_clock
        self._policy: Policy | None = None

    def on_policy(self, policy: Policy) -> None:
        self._policy = policy
        self.collector.configure([*sources_from_policy(policy), *batch_sources(policy)])
        self.quotas.on_policy(policy)

    async def overview(
        self, tenants: int = 50, points: int = 120, since: float | None = None
    ) -> Overview:
        c = self.collector
        totals, now, then = c.totals, self._wall(), c.since()
        policy = self._policy
        series = list(c.points)[-points:] if points else []
        if since is not None:
            series = [p for p in series if round(p.t, 3) > since]  # as the answer writes t
        rows = tenant_rows(policy, totals, tenants) if policy is not None else []
        windows, quota_error = await self.quotas.read([r["tenant"] for r in rows])
        return {
            "api_version": API_VERSION,
            "time": round(now, 3),
            "interval_s": c.interval,
            "pools": self._pools(),
            "pool_status": pool_rows(policy, totals, c.window_start(), c.last_round),
            "lanes": lane_rows(totals),
            "tenants": recent_rejections(with_windows(rows, windows), totals, then, c.last_round),
            "quota_source": "redis" if self.quotas.configured else None,
            "quota_error": quota_error,
            "tenant_count": len(policy.tenants) if policy is not None else 0,
            "rejections": {k: int(v) for k, v in sorted(totals.rejections.items())},
            "decisions": {k: int(v) for k, v in sorted(totals.decisions.items())},
            "envoys": self._nodes(),
            "sources": self.collector.sources(),
            "batch": batch_panel(policy, totals, list(c.points)),
            "series": [p.to_json() for p in series],
        }

    def routes(self) -> list[web.RouteDef]:
        async def overview(request: web.Request) -> web.Response:
            try:
                tenants = _int_arg(request.query, "tenants", 50, 0, 100_000)
                points = _int_arg(request.query, "points", 120, 0, MAX_POINTS)
                since = _float_arg(request.query, "since")
            except ValueError as exc:
                return _bad(
                    f"bad query: {exc} (tenants: 0..100000, points: 0..{MAX_POINTS}, "
                    "since: Unix seconds)"
                )
            answer = await self.overview(tenants, points, since)
            return web.Response(
                text=json.dumps(answer, separators=(",", ":")),
                content_type="application/json",
                headers={"Cache-Control": "no-store"},
            )

        async def page(request: web.Request) -> web.Response:
            name = request.match_info.get("name") or "index.html"
            kind = _STATIC.get(name)
            if kind is None:
                raise web.HTTPNotFound()
            text = resources.files(__package__).joinpath("static", name).read_text()
            return web.Response(text=text, content_type=kind, headers={"Cache-Control": "no-cache"})

        async def to_page(_request: web.Request) -> web.Response:
            raise web.HTTPFound("/dashboard/")

        return [
            web.get(OVERVIEW_PATH, overview),
            web.get("/dashboard", to_page),
            web.get("/dashboard/", page),
            web.get("/dashboard/{name}", page),
        ]

    def start(self) -> None:
        self.collector.start()

    async def aclose(self) -> None:
        await self.collector.aclose()
        await self.quotas.aclose()
