"""The tenants' token budgets as the quota itself counts them: read from Redis, the rate-limit
service's own state (``quota.reader``: the tenant's live quota fields over the policy's,
its bucket level and this window's counters), not from counters since a process started.

One read per overview answer, for the tenants the answer shows (at most :data:`MAX_TENANTS`):
the peeks of one answer go to Redis in one pipeline. Redis is the one ``tokenweir up`` started
(``ControlPlaneSettings.redis_url``), else the policy's ``ratelimit.redis_url``; without either
the budgets' ``used`` stay ``null``. A failed read is counted in
``tokenweir_dashboard_quota_read_errors_total`` and reported in the answer's ``quota_error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from policy import Policy
from quota.errors import QuotaUnavailable
from quota.reader import QuotaReader, WindowUsage
from runtime.redis_connect import LazyRedis, RedisAuthError

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["MAX_TENANTS", "QUOTAS", "QuotaWindows"]

log = logging.getLogger("tokenweir.dashboard")

MAX_TENANTS = 500  # tenants read per answer; rows past it show the budget without `used`
QUOTAS = ("tokens", "requests", "usd")  # read for each tenant (the binding limit is any of them)


class QuotaWindows:
    """``read(tenants)`` → each tenant's token windows now, or an error text; ``aclose()``."""

    def __init__(
        self,
        redis_url: str | None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 1.0,
    ) -> None:
        self._given = redis_url
        # the control plane's Redis client, connected at the first read (the batch runners'
        # words are read through it too: ControlPlane.valley)
        self.redis = LazyRedis(redis_url, timeout=timeout)
        self._clock = clock
        self._timeout = timeout
        self._reader: QuotaReader | None = None
        self._reader_on: Redis | RedisCluster | None = None  # the client it reads
        self._policy: Policy | None = None
        self.errors = Counter(
            "tokenweir_dashboard_quota_read_errors_total",
            "dashboard reads of the tenants' quota state in Redis that failed",
            registry=registry,
        )

    def on_policy(self, policy: Policy) -> None:
        self._policy = policy
        # a new Redis: the next read connects to it
        self.redis.use(self._given or (policy.ratelimit.redis_url if policy.ratelimit else None))
        if self._reader is not None:
            self._reader.update_policy(policy)

    @property
    def configured(self) -> bool:
        return self.redis.url is not None and self._policy is not None

    async def read(self, tenants: Sequence[str]) -> tuple[dict[str, list[WindowUsage]], str | None]:
        if not self.configured or not tenants:
            return {}, None
        names = list(tenants)[:MAX_TENANTS]
        try:
            reader = await self._connect()
            found = await asyncio.gather(*(reader.usage(t, QUOTAS) for t in names))
        except (QuotaUnavailable, RedisError, RedisAuthError, OSError, TimeoutError) as exc:
            self.errors.inc()
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning("dashboard: reading quotas from redis: %s", text)
            return {}, f"redis: {text}"
        return dict(zip(names, found, strict=True)), None

    async def _connect(self) -> QuotaReader:
        client = await self.redis()
        assert client is not None and self._policy is not None
        if self._reader is None or self._reader_on is not client:
            if self._reader is not None:
                await self._reader.aclose()
            self._reader = QuotaReader(
                client, self._policy, clock=self._clock, timeout=self._timeout
            )
            self._reader_on = client
        return self._reader

    async def aclose(self) -> None:
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None
        await self.redis.aclose()
