"""Redis health: a circuit that opens on the first error and a probe that closes it again.

While open, decisions skip Redis entirely (answered at once by the fallback), so a dead Redis
costs no timeouts; the probe pings with back-off until Redis answers. An error (connection refused,
reset) opens it at once; timeouts only when ``timeouts_to_open`` of them fall within a second, so
one slow moment (or a busy event loop) falls back for the calls it hit and nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ratelimit_service.metrics import Metrics
from runtime.tasks import stop_task

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
        timeouts_to_open: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timeouts_to_open = timeouts_to_open
        self._timeouts: list[float] = []
        self._clock = clock
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
        if kind == "timeout":
            now = self._clock()
            self._timeouts = [t for t in self._timeouts if now - t < 1.0] + [now]
            if len(self._timeouts) < self._timeouts_to_open:
                return
        self._timeouts.clear()
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
        probe, self._probe = self._probe, None
        await stop_task(probe, log=log)
