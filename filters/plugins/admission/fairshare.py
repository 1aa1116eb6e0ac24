"""Virtual token counters shared between filter processes, and the lanes' fairness gauges.

Where a pool's admission is split over several filter processes (filter servers side by side,
worker processes, gateway replicas: :func:`~filters.plugins.admission.limits.process_split`), each
process serves its own queues, but a tenant's share must count what **every** process served
it: otherwise a tenant whose streams one process happens to see less of is served more there.
So every ``SYNC_S`` each process adds the tokens (and requests) its usage meter settled per
tenant to a Redis hash per pool and lane (``HINCRBYFLOAT`` / ``HINCRBY``, one pipeline with the
``HGETALL`` that reads the totals back) and charges each tenant's counter with what the others
added since (:meth:`~filters.plugins.admission.ledger.TokenLedger.settle` with ``local=False``; the
request counts teach every process the tenant's cost per request, though Envoy's access log
brings the usage to only one of them). The hash expires
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
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.tasks import stop_task

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from filters.plugins.admission.gate import Gates

__all__ = ["FairShare", "fairshare_key"]

log = logging.getLogger("tokenweir.admission")

SYNC_S = 0.5
GAUGE_S = 5.0
WINDOW_S = 60.0
TTL_S = 3600
_COUNT = "\x00n"  # a tenant's field + this: its settled requests (beside its tokens)


def fairshare_key(pool: str, lane: str) -> str:
    return f"tokenweir:vtc:{{{pool}:{lane}}}"


class FairShare:
    """Owns the sync-and-gauges task; ``start()`` it, ``aclose()`` stops it."""

    def __init__(
        self,
        gates: Gates,
        redis: Redis | None,
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
        shared: list[tuple[str, str, dict[str, tuple[float, int]]]] = []
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

    async def _sync(self, shared: list[tuple[str, str, dict[str, tuple[float, int]]]]) -> None:
        assert self.redis is not None
        try:
            async with asyncio.timeout(self.timeout):
                pipe = self.redis.pipeline(transaction=False)
                for pool, lane, pending in shared:
                    key = fairshare_key(pool, lane)
                    for tenant, (tokens, requests) in pending.items():
                        pipe.hincrbyfloat(key, tenant, tokens)
                        pipe.hincrby(key, tenant + _COUNT, requests)
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
            i += 2 * len(pending) + (1 if pending else 0)
            fields = {
                (k.decode() if isinstance(k, bytes) else str(k)): float(v)
                for k, v in replies[i].items()
            }
            i += 1
            known = self._known.setdefault((pool, lane), {})
            gate = self.gates.pools().get(pool)
            for name, total in fields.items():
                if name.endswith(_COUNT):
                    continue
                count = fields.get(name + _COUNT, 0.0)
                before = known.get(name)
                before_n = known.get(name + _COUNT)
                known[name], known[name + _COUNT] = total, count
                if before is None or before_n is None:
                    continue  # served before this process looked: history, not this share
                mine, mine_n = pending.get(name, (0.0, 0))
                others, others_n = total - before - mine, round(count - before_n - mine_n)
                if others > 0 and gate is not None:
                    gate.core.settle(
                        now, lane, name, others, local=False, requests=max(0, others_n)
                    )

    def gauges(self, now: float) -> None:
        for pool, gate in self.gates.pools().items():
            for lane, q in gate.core.queues.items():
                fair = q.ledger.snapshot(now, WINDOW_S, q.tenants())
                if fair is None:
                    continue
                self.jain.labels(pool, lane).set(fair.jain)
                self.gap.labels(pool, lane).set(fair.gap)
                self.tenants.labels(pool, lane).set(fair.tenants)
