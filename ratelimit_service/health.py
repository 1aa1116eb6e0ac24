"""Redis health: a circuit that opens on the first error and a probe that closes it again.

While open, decisions skip Redis entirely (answered at once by the fallback), so a dead Redis
costs no timeouts; the probe pings with back-off until Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ratelimit_service.metrics import Metrics

__all__ = ["RedisHealth"]

log = logging.getLogger(__name__)


class RedisHealth:
    def __init__(
        self,
        ping: Callable[[], Awaitable[object]],
        metrics: Metrics,
        *,
        min_backoff: float = 0.05,
        max_backoff: float = 1.0,
        ping_timeout: float = 0.5,
    ) -> None:
        self._ping = ping
        self._metrics = metrics
        self._min = min_backoff
        self._max = max_backoff
        self._ping_timeout = ping_timeout
        self._probe: asyncio.Task[None] | None = None
        self.up = True

    def failed(self, reason: BaseException) -> None:
        kind = "timeout" if isinstance(reason, TimeoutError) else "error"
        self._metrics.redis_errors.labels(kind).inc()
        if not self.up:
            return
        self.up = False
        self._metrics.redis_up.set(0)
        log.warning(
            "redis unavailable (%s: %s): deciding without it until it answers", kind, reason
        )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._run_probe())

    async def _run_probe(self) -> None:
        delay = self._min
        while not self.up:
            await asyncio.sleep(delay)
            try:
                await asyncio.wait_for(self._ping(), self._ping_timeout)
            except Exception as exc:  # any failure (connection, timeout, error reply): keep probing
                log.debug("redis probe failed: %s", exc)
                delay = min(self._max, delay * 2)
                continue
            self.up = True
            self._metrics.redis_up.set(1)
            log.warning("redis answers again")

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
