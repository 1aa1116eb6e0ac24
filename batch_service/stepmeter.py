"""Reads each replica's step counters for the step guard (batch_service/stepguard.py).

Every ``interval`` the meter reads ``/metrics`` of the pool's fresh replicas (the endpoints the
pool state names) and keeps two lines: the token-gap histogram's sum and count (SGLang's
``sglang:inter_token_latency_seconds``, vLLM's ``vllm:inter_token_latency_seconds`` or, before
it, ``vllm:time_per_output_token_seconds``; the emulator exports them in either flavour), read
with the pool scraper's own parser (:func:`poolstate.counters.counter_sums`). A replica that
does not answer keeps its intervals (the guard uses what it measured last); one whose counters
go back (a restart) starts again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import aiohttp

from batch_service.stepguard import StepGuard, StepReading
from poolstate.counters import counter_sums

__all__ = ["StepMeter", "parse_step_reading"]

log = logging.getLogger("tokenweir.batch.stepmeter")


def parse_step_reading(text: str, at: float) -> StepReading | None:
    """The token-gap sum and count in ``text`` (read at ``at``), summed over label sets
    (data-parallel ranks, engines); None when the count is absent (a page with no token-gap
    histogram)."""
    sums = counter_sums(text)
    if "itl_count" not in sums:
        return None
    return StepReading(sums.get("itl_sum", 0.0), sums["itl_count"], at)


class StepMeter:
    """Feeds ``guard`` from the replicas ``endpoints()`` names, every ``interval`` seconds."""

    def __init__(
        self,
        guard: StepGuard,
        endpoints: Callable[[], Iterable[str]],
        http: aiohttp.ClientSession,
        *,
        clock: Callable[[], float],
        interval: float = 0.5,
        timeout: float = 1.0,
    ) -> None:
        self.guard = guard
        self.endpoints = endpoints
        self.http = http
        self.clock = clock
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def read(self, endpoint: str) -> StepReading | None:
        try:
            async with self.http.get(f"http://{endpoint}/metrics", timeout=self.timeout) as r:
                if r.status != 200:
                    return None
                text = await r.text()
                return parse_step_reading(text, self.clock())
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("step meter: %s: %s", endpoint, exc)
            return None

    async def once(self) -> None:
        eps = list(self.endpoints())
        readings = await asyncio.gather(*(self.read(ep) for ep in eps))
        for ep, reading in zip(eps, readings, strict=True):
            if reading is not None:
                self.guard.observe(ep, reading)
        if eps:  # no pool state (stale, not yet read): keep what was measured
            self.guard.forget(eps)

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self.interval)
