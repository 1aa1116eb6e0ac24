"""The canary watch: every ``rollback.interval``, a sample per pool with a live canary; a breach
that lasts ``rollback.sustain`` over the trailing ``rollback.window`` sets the pool's canary
weight to 0 in every snapshot (logged, counted, on /metrics and ``GET /api/v1/canary``). The
rollback holds until the policy's canary section changes (an operator's new decision).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from controlplane.canary.errors import CanaryError
from controlplane.canary.judge import Guard, Sample
from controlplane.canary.overrides import OverrideCache
from controlplane.canary.sample import gateway_counts, replica_histograms, version_counts
from controlplane.saturation.errors import ScrapeError
from policy.model import CanaryPolicy, Policy
from runtime.tasks import stop_task

__all__ = ["CANARY_PATH", "CanaryStatus", "CanaryWatcher"]


class CanaryStatus(TypedDict):
    """One pool of ``GET /api/v1/canary``'s ``pools``."""

    configured_weight: int
    weight: int
    state: str  # active, rolled_back
    reason: str
    rolled_back_at: float | None  # wall clock
    breaching: str  # the guard's last breach, "" without one


log = logging.getLogger("tokenweir.canary")
CANARY_PATH = "/api/v1/canary"


@dataclass
class _Pool:
    config: CanaryPolicy
    guard: Guard
    weight: int
    rolled_back: bool = False
    reason: str = ""
    rolled_back_at: float | None = None  # wall clock


class CanaryWatcher:
    """Owns its task (``start``/``aclose``); ``configure`` on every policy."""

    def __init__(
        self,
        cache: OverrideCache,
        fetch: Callable[[str, float], Awaitable[str]],
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        registry: CollectorRegistry,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._cache, self._fetch = cache, fetch
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self.pools: dict[str, _Pool] = {}
        self._policy: Policy | None = None
        self._task: asyncio.Task[None] | None = None
        self.weight = Gauge(
            "tokenweir_canary_weight", "Canary traffic weight in force (percent)", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.rollbacks = Counter(
            "tokenweir_canary_rollbacks", "Automatic canary rollbacks", ["pool", "reason"],
            registry=registry,
        )  # fmt: skip
        self.errors = Counter(
            "tokenweir_canary_sample_errors", "Canary samples that could not be read", ["pool"],
            registry=registry,
        )  # fmt: skip

    def configure(self, policy: Policy) -> None:
        self._policy = policy
        seen = set()
        for name, pool in policy.pools.items():
            c = pool.canary
            if c is None:
                continue
            seen.add(name)
            cur = self.pools.get(name)
            if cur is not None and cur.config == c:
                continue  # same decision: a rollback in force stays
            self.pools[name] = _Pool(c, Guard(c.rollback), c.weight)
            self._cache.override(name, None)
            self.weight.labels(name).set(c.weight)
        for name in set(self.pools) - seen:
            del self.pools[name]
            self._cache.override(name, None)

    async def check_once(self) -> None:
        for name, p in list(self.pools.items()):
            if p.rolled_back or p.weight == 0 or not p.config.rollback.enabled:
                continue
            try:
                sample = await self._sample(name, p.config)
            except (CanaryError, ScrapeError) as exc:
                self.errors.labels(name).inc()
                log.debug("canary sample of %s failed: %s", name, exc)
                continue
            verdict = p.guard.observe(sample)
            if verdict is not None:
                self._roll_back(name, p, str(verdict), verdict.reason)

    def _roll_back(self, name: str, p: _Pool, why: str, reason: str) -> None:
        p.rolled_back, p.weight, p.reason = True, 0, why
        p.rolled_back_at = self._wall()
        self._cache.override(name, 0)
        self.weight.labels(name).set(0)
        self.rollbacks.labels(name, reason).inc()
        log.warning("pool %s: canary rolled back to weight 0: %s", name, why)

    async def _sample(self, name: str, c: CanaryPolicy) -> Sample:
        policy = self._policy
        assert policy is not None
        pool = policy.pools[name]
        f = policy.filters
        gw_pages: list[str] = []
        if f is not None and f.metrics_port is not None:
            for i in range(f.processes):
                gw_pages.append(await self._fetch(f"{f.address.host}:{f.metrics_port + i}", 1.0))
        hist = {}
        for version, eps in (("baseline", pool.endpoints), ("canary", c.endpoints)):
            pages = []
            for ep in eps:
                with contextlib.suppress(ScrapeError):  # a dead replica: the 5xx show it
                    pages.append(await self._fetch(str(ep), 1.0))
            hist[version] = replica_histograms(pages)
        counts = version_counts(gateway_counts(gw_pages, name), hist)
        return Sample(self._clock(), counts)

    def status(self) -> dict[str, CanaryStatus]:
        return {
            name: {
                "configured_weight": p.config.weight,
                "weight": p.weight,
                "state": "rolled_back" if p.rolled_back else "active",
                "reason": p.reason,
                "rolled_back_at": p.rolled_back_at,
                "breaching": str(p.guard.last) if p.guard.last is not None else "",
            }
            for name, p in sorted(self.pools.items())
        }

    def routes(self) -> list[web.RouteDef]:
        async def canary(request: web.Request) -> web.Response:
            return web.json_response({"pools": self.status()})

        return [web.get(CANARY_PATH, canary)]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokenweir-canary-watch")

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # one bad round must not end the watch; logged, next round
                log.exception("canary check failed")
            intervals = [p.config.rollback.interval for p in self.pools.values()]
            await self._sleep(min(intervals, default=1.0))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
