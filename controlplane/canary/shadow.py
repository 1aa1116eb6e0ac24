"""Primary vs shadow: for every route that mirrors to a shadow pool, the control plane reads both
pools' replica pages (the same pages the pool scraper reads) and reports, since it began
watching: finished and aborted requests, completion tokens per request, TTFT p95 and TBT p95 of
each side (``GET /api/v1/shadow``, ``tokenweir status``). Envoy discards the shadow's answers,
so the comparison is per pool over the same mirrored traffic, not per request pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypedDict

from aiohttp import web

from controlplane.canary.judge import Buckets, p95
from controlplane.canary.sample import replica_counters, replica_histograms
from controlplane.saturation.errors import ScrapeError
from policy.model import Address, Policy
from runtime.tasks import stop_task

__all__ = [
    "SHADOW_PATH",
    "Comparison",
    "RouteShadowReport",
    "ShadowWatcher",
    "SideFigures",
    "compare",
]

log = logging.getLogger("tokenweir.shadow")
SHADOW_PATH = "/api/v1/shadow"
Side = tuple[dict[str, float], Buckets, Buckets]


class SideFigures(TypedDict):
    """One pool's figures between two samples."""

    requests: float
    aborted: float
    completion_tokens_per_request: float | None
    ttft_p95_s: float | None
    tbt_p95_s: float | None


class Comparison(TypedDict):
    primary: SideFigures
    shadow: SideFigures


class RouteShadowReport(Comparison):
    """One mirroring route of ``GET /api/v1/shadow``'s ``routes``."""

    primary_pool: str
    shadow_pool: str


def _minus(new: Buckets, old: Buckets) -> Buckets:
    before = dict(old)
    return tuple((le, c - before.get(le, 0.0)) for le, c in new)


def _side(new: Side, old: Side) -> SideFigures:
    counts = {k: v - old[0].get(k, 0.0) for k, v in new[0].items()}
    done = counts["requests"]
    return {
        "requests": done,
        "aborted": counts["aborted"],
        "completion_tokens_per_request": counts["completion_tokens"] / done if done else None,
        "ttft_p95_s": p95(_minus(new[1], old[1])),
        "tbt_p95_s": p95(_minus(new[2], old[2])),
    }


def compare(primary: tuple[Side, Side], shadow: tuple[Side, Side]) -> Comparison:
    """Pure: each side's figures between its first and latest sample."""
    return {"primary": _side(primary[1], primary[0]), "shadow": _side(shadow[1], shadow[0])}


class ShadowWatcher:
    def __init__(
        self,
        fetch: Callable[[str, float], Awaitable[str]],
        *,
        interval: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._fetch, self._interval, self._sleep = fetch, interval, sleep
        self._pairs: dict[str, tuple[str, str]] = {}  # route → (primary pool, shadow pool)
        self._pools: dict[str, tuple[Address, ...]] = {}
        self._first: dict[str, Side] = {}
        self._last: dict[str, Side] = {}
        self._task: asyncio.Task[None] | None = None

    def configure(self, policy: Policy) -> None:
        pairs = {}
        for gw in policy.gateways.values():
            for r in gw.routes:
                if r.shadow is not None and r.pool is not None:
                    pairs[r.name] = (r.pool, r.shadow.pool)
        self._pairs = pairs
        self._pools = {p: policy.pools[p].endpoints for pair in pairs.values() for p in pair}

    async def _read(self, pool: str) -> Side:
        pages = []
        for ep in self._pools.get(pool, ()):
            with contextlib.suppress(ScrapeError):
                pages.append(await self._fetch(str(ep), 1.0))
        ttft, tbt = replica_histograms(pages)
        return replica_counters(pages), ttft, tbt

    async def check_once(self) -> None:
        for pool in self._pools:
            side = await self._read(pool)
            self._first.setdefault(pool, side)
            self._last[pool] = side

    def report(self) -> dict[str, RouteShadowReport]:
        out: dict[str, RouteShadowReport] = {}
        for route, (primary, shadow) in sorted(self._pairs.items()):
            if primary in self._last and shadow in self._last:
                pair = compare(
                    (self._first[primary], self._last[primary]),
                    (self._first[shadow], self._last[shadow]),
                )
                out[route] = {"primary_pool": primary, "shadow_pool": shadow, **pair}
        return out

    def routes(self) -> list[web.RouteDef]:
        async def shadow(request: web.Request) -> web.Response:
            if "refresh" in request.query:
                await self.check_once()
            return web.json_response({"routes": self.report()})

        return [web.get(SHADOW_PATH, shadow)]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokenweir-shadow-watch")

    async def _run(self) -> None:
        while True:
            if self._pairs:
                try:
                    await self.check_once()
                except Exception:  # one bad round must not end the watch; logged, next round
                    log.exception("shadow comparison failed")
            await self._sleep(self._interval)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
