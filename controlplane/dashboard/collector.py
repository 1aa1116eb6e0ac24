"""The dashboard's scrape loop: the filter server's and rate-limit service's ``/metrics`` (every
worker process) and every connected gateway Envoy's ``/stats/prometheus`` each ``interval``,
summed into :class:`~controlplane.dashboard.summary.Totals`, and a chart point per round over
the last ``window`` rounds (a smoother line than one round).

It scrapes all the time, whether or not anybody reads it, and keeps a bounded history: the
last ``keep`` chart points (15 minutes at the default interval) and the totals of the rounds in
the last ``recent_s`` seconds (for "recent" figures such as a tenant's 429s). A page opened
now draws the history at once. Only the lines the dashboard reads are parsed
(:func:`~controlplane.dashboard.summary.totals_of`), which keeps a round cheap on a busy box.

One owner: :meth:`ServiceCollector.start` / :meth:`aclose`. Clock injected; a source that does
not answer is reported in :meth:`sources` and left out of the round (its counters come back
with it, and deltas never go below zero).
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

__all__ = ["HISTORY_S", "MetricsSource", "ServiceCollector", "Source"]

log = logging.getLogger("tokenweir.dashboard")

HISTORY_S = 900.0  # the charts' history: 15 minutes


class MetricsSource(Protocol):
    async def metrics(self, endpoint: str, timeout_s: float, path: str = "/metrics") -> str: ...


@dataclass(frozen=True)
class Source:
    """One process to scrape: ``name`` as the page shows it, ``endpoint`` ``host:port``,
    ``path`` what to GET there."""

    name: str
    endpoint: str
    path: str = "/metrics"


class ServiceCollector:
    def __init__(
        self,
        fetch: MetricsSource,
        *,
        clock: Callable[[], float],
        interval: float = 1.0,
        window: int = 5,
        history_s: float = HISTORY_S,
        recent_s: float = 300.0,
        more: Callable[[], Sequence[Source]] = list,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self.interval = interval
        self.rounds = 0  # scrape rounds made
        self._rounds: deque[tuple[float, Totals]] = deque(maxlen=window + 1)
        self.points: deque[Point] = deque(maxlen=max(1, round(history_s / interval)))
        self.recent_s = recent_s
        self._recent: deque[tuple[float, Totals]] = deque(
            maxlen=max(2, round(recent_s / interval) + 1)
        )
        self.totals = Totals()
        self._sources: list[Source] = []
        self._more = more  # sources that come and go (the connected Envoys)
        self._status: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._followers: list[Callable[[float, Totals], None]] = []

    def follow(self, listener: Callable[[float, Totals], None]) -> None:
        """Called with ``(now, totals)`` after every round (the online planner reads the
        arrivals by lane from it)."""
        self._followers.append(listener)

    def configure(self, sources: Sequence[Source]) -> None:
        self._sources = list(sources)

    def _all(self) -> list[Source]:
        return [*self._sources, *self._more()]

    def sources(self) -> list[dict[str, object]]:
        return [
            {"name": s.name, "endpoint": s.endpoint, "ok": self._status.get(s.name, "") is None,
             "error": self._status.get(s.name, "not scraped yet")}
            for s in self._all()
        ]  # fmt: skip

    async def _one(self, src: Source) -> str | None:
        try:
            if src.path == "/metrics":
                text = await self._fetch.metrics(src.endpoint, max(0.2, self.interval))
            else:
                text = await self._fetch.metrics(src.endpoint, max(0.2, self.interval), src.path)
        except ScrapeError as exc:
            self._status[src.name] = str(exc)
            return None
        self._status[src.name] = None
        return text

    async def scrape_once(self) -> None:
        sources = self._all()
        texts = await asyncio.gather(*(self._one(s) for s in sources))
        names = {s.name for s in sources}
        for gone in set(self._status) - names:
            del self._status[gone]
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
        self._recent.append((now, totals))
        self.totals = totals
        self.rounds += 1
        for listener in self._followers:
            listener(now, totals)

    @property
    def last_round(self) -> float:
        """When the latest round was made (0 before the first)."""
        return self._rounds[-1][0] if self._rounds else 0.0

    def window_start(self) -> tuple[float, Totals] | None:
        """The round the latest chart point's rates start from (None before two rounds)."""
        return self._rounds[0] if len(self._rounds) > 1 else None

    def since(self) -> tuple[float, Totals] | None:
        """The oldest round kept for "recent" figures (at most ``recent_s`` old), or None."""
        now = self._clock()
        for t, totals in self._recent:
            if now - t <= self.recent_s + self.interval:
                return t, totals
        return None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="dashboard-collector")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # a round every interval, however long the round took (at least a pause)
            started = loop.time()
            await self.scrape_once()
            await asyncio.sleep(max(0.1 * self.interval, self.interval - (loop.time() - started)))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
