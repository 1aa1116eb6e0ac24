"""The dashboard's scrape loop: the filter server's and rate-limit service's ``/metrics`` (every
worker process) each ``interval``, summed into :class:`~controlplane.dashboard.summary.Totals`,
and a chart point per round over the last ``window`` rounds (a smoother line than one round).

One owner: :meth:`ServiceCollector.start` / :meth:`aclose`. Clock injected; a source that does
not answer is reported in :meth:`sources` and left out of the round (its counters come back
with it, and deltas never go below zero).

It scrapes only while somebody reads it (:meth:`read`, called by every ``/api/v1/overview``):
after ``idle_after`` seconds without a reader it sleeps, and the next reader gets a fresh round
before its answer. Parsing a busy filter server's page (hundreds of KB) every second costs the
control plane a good share of a core, taken from the serving processes on a small machine.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.dashboard.errors import SourceError
from controlplane.dashboard.summary import Point, Totals, point_between, totals_of
from controlplane.saturation.errors import ScrapeError
from runtime.tasks import stop_task

__all__ = ["MetricsSource", "ServiceCollector", "Source"]

log = logging.getLogger("tokenweir.dashboard")


class MetricsSource(Protocol):
    async def metrics(self, endpoint: str, timeout_s: float) -> str: ...


@dataclass(frozen=True)
class Source:
    """One process to scrape: ``name`` as the page shows it, ``endpoint`` ``host:port``."""

    name: str
    endpoint: str


class ServiceCollector:
    def __init__(
        self,
        fetch: MetricsSource,
        *,
        clock: Callable[[], float],
        interval: float = 1.0,
        window: int = 5,
        keep: int = 300,
        idle_after: float | None = 60.0,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self.interval = interval
        self.idle_after = idle_after  # None: scrape all the time
        self._last_read: float | None = None
        self._wake = asyncio.Event()
        self.rounds = 0  # scrape rounds made
        self._rounds: deque[tuple[float, Totals]] = deque(maxlen=window + 1)
        self.points: deque[Point] = deque(maxlen=keep)
        self.totals = Totals()
        self._sources: list[Source] = []
        self._status: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None

    def configure(self, sources: Sequence[Source]) -> None:
        self._sources = list(sources)
        self._status = {s.name: self._status.get(s.name, "not scraped yet") for s in sources}

    def sources(self) -> list[dict[str, object]]:
        return [
            {"name": s.name, "endpoint": s.endpoint, "ok": self._status.get(s.name) is None,
             "error": self._status.get(s.name)}
            for s in self._sources
        ]  # fmt: skip

    async def _one(self, src: Source) -> str | None:
        try:
            text = await self._fetch.metrics(src.endpoint, max(0.2, self.interval))
        except ScrapeError as exc:
            self._status[src.name] = str(exc)
            return None
        self._status[src.name] = None
        return text

    async def scrape_once(self) -> None:
        texts = await asyncio.gather(*(self._one(s) for s in self._sources))
        try:
            totals = totals_of(t for t in texts if t is not None)
        except SourceError as exc:
            log.warning("dashboard: %s", exc)
            return
        now = self._clock()
        if self._rounds:
            t_old, old = self._rounds[0]
            self.points.append(point_between(old, t_old, totals, now))
        self._rounds.append((now, totals))
        self.totals = totals
        self.rounds += 1

    def _idle(self) -> bool:
        if self.idle_after is None:
            return False
        last = self._last_read
        return last is None or self._clock() - last > self.idle_after

    async def read(self) -> None:
        """A reader is here: scrape on (or again); the first reader after a pause gets a fresh
        round before its answer (the chart's rates restart from it)."""
        was_idle = self._idle()
        self._last_read = self._clock()
        if was_idle and self._task is not None:
            self._rounds.clear()
            await self.scrape_once()
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="dashboard-collector")

    async def _loop(self) -> None:
        while True:
            if self._idle():
                self._wake.clear()
                await self._wake.wait()
                await asyncio.sleep(self.interval)  # the reader's round was just made
                continue
            await self.scrape_once()
            await asyncio.sleep(self.interval)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
