"""Virtual token counters shared between filter processes, and the lanes' fairness gauges.

Where a pool's admission is split over several filter processes (filter servers side by side,
worker processes, gateway replicas: :func:`~filters.admission.limits.process_split`), each
process serves its own queues, but a tenant's share must count what **every** process served
it: otherwise a tenant whose streams one process happens to see less of is served more there.
So every ``SYNC_S`` each process adds the tokens its usage meter settled per tenant to a Redis
hash per pool and lane (``HINCRBYFLOAT``, one pipeline with the ``HGETALL`` that reads the
totals back) and charges each tenant's counter with what the others added since
(:meth:`~filters.admission.ledger.TokenLedger.settle` with ``local=False``). The hash expires
an hour after its last write. Redis down or slow: each process counts its own (the behaviour
without sharing), counted in ``tokenweir_admission_fairshare_syncs_total{outcome="error"}``.

Every ``GAUGE_S`` it also sets each lane's fairness over the last ``WINDOW_S`` among the
tenants that were backlogged in it (docs/metrics.md): Jain's index of their weighted settled
tokens and the largest gap between two of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.tasks import stop_task

__all__ = ["FairShare", "fairshare_key"]

log = logging.getLogger("tokenweir.admission")

SYNC_S = 0.5
GAUGE_S = 5.0
WINDOW_S = 60.0
TTL_S = 3600


def fairshare_key(pool: str, lane: str) -> str:
    return f"tokenweir:vtc:{{{pool}:{lane}}}"


class FairShare:
    """Owns the sync-and-gauges task; ``start()`` it, ``aclose()`` stops it."""

    def __init__(
        self,
        gates: Any,
        redis: Any | None,
        *,
        clock: Callable[[], float],
        registry: CollectorRegistry,
        timeout: float = 0.2,
    ) -> None:
        self.gates = gates
        self.redis = redis
        self.clock = clock
        self.timeout = timeout
        self._known: dict[tuple[str, str], dict[str, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._next_gauges = 0.0
        p, r = "tokenweir_admission_", registry
        self.syncs = Counter(
            p + "fairshare_syncs", "exchanges of settled tokens with the other filter processes",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.jain = Gauge(
            p + "fairness_jain",
            "Jain's index of the weighted settled tokens of the tenants backlogged in the lane "
            "over the last minute (1: shares exactly by weight)",
            ["pool", "lane"], registry=r,
        )  # fmt: skip
        self.gap = Gauge(
            p + "service_gap_tokens",
            "the largest difference in weighted settled tokens between two tenants backlogged "
            "in the lane over the last minute",
            ["pool", "lane"], registry=r,
        )  # fmt: skip
        self.tenants = Gauge(
            p + "fairness_tenants", "tenants backlogged in the lane over the last minute",
            ["pool", "lane"], registry=r,
        )  # fmt: skip

    def start(self) -> FairShare:
        self._task = asyncio.create_task(self.run(), name="admission-fairshare")
        return self

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            await self.tick()

    async def tick(self) -> None:
        """One exchange with Redis (where admission is split) and, when due, the gauges."""
        now = self.clock()
        shared = []
        for pool, gate in self.gates.pools().items():
            for lane, q in gate.core.queues.items():
                pending = q.ledger.take_pending()
                if gate.split > 1 and self.redis is not None:
                    shared.append((pool, lane, pending))
        if shared:
            await self._sync(shared)
        if now >= self._next_gauges:
            self._next_gauges = now + GAUGE_S
            self.gauges(now)

    async def _sync(self, shared: list[tuple[str, str, dict[str, float]]]) -> None:
        assert self.redis is not None
        try:
            async with asyncio.timeout(self.timeout):
                pipe = self.redis.pipeline(transaction=False)
                for pool, lane, pending in shared:
                    key = fairshare_key(pool, lane)
                    for tenant, tokens in pending.items():
                        pipe.hincrbyfloat(key, tenant, tokens)
                    if pending:
                        pipe.expire(key, TTL_S)
                    pipe.hgetall(key)
                replies = await pipe.execute()
        except Exception as e:  # Redis down or slow: this process counts its own
            self.syncs.labels("error").inc()
            log.debug("fair-share sync failed: %s", e)
            return
        self.syncs.labels("ok").inc()
        now = self.clock()
        i = 0
        for pool, lane, pending in shared:
            i += len(pending) + (1 if pending else 0)
            totals = replies[i]
            i += 1
            known = self._known.setdefault((pool, lane), {})
            gate = self.gates.pools().get(pool)
            for raw, value in totals.items():
                tenant = raw.decode() if isinstance(raw, bytes) else str(raw)
                total = float(value)
                before = known.get(tenant)
                known[tenant] = total
                if before is None:
                    continue  # served before this process looked: history, not this share
                others = total - before - pending.get(tenant, 0.0)
                if others > 0 and gate is not None:
                    gate.core.settle(now, lane, tenant, others, local=False)

    def gauges(self, now: float) -> None:
        for pool, gate in self.gates.pools().items():
            for lane, q in gate.core.queues.items():
                fair = q.ledger.snapshot(now, WINDOW_S, q.tenants())
                if fair is None:
                    continue
                self.jain.labels(pool, lane).set(fair.jain)
                self.gap.labels(pool, lane).set(fair.gap)
                self.tenants.labels(pool, lane).set(fair.tenants)
