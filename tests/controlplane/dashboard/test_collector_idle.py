"""The dashboard's collector scrapes only while somebody reads it."""

from __future__ import annotations

import asyncio

from controlplane.dashboard.collector import ServiceCollector, Source

PAGE = "# TYPE tokenweir_filters_requests_total counter\n"


class CountingFetch:
    def __init__(self) -> None:
        self.calls = 0

    async def metrics(self, endpoint: str, timeout_s: float) -> str:
        self.calls += 1
        return PAGE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.02)


async def test_nobody_reading_means_no_scrape_and_a_reader_gets_a_fresh_round() -> None:
    fetch, clock = CountingFetch(), Clock()
    c = ServiceCollector(fetch, clock=clock, interval=0.01, idle_after=60.0)
    c.configure([Source("filters", "127.0.0.1:1")])
    c.start()
    try:
        await _settle()
        assert fetch.calls == 0  # no reader yet: the page is not scraped
        await c.read()
        assert fetch.calls == 1  # the first reader's round, before its answer
        await _settle()
        assert fetch.calls > 1  # scraping on while read
        clock.now += 61.0  # nobody read for longer than idle_after
        await _settle()
        stopped_at = fetch.calls
        await _settle()
        assert fetch.calls == stopped_at
        await c.read()
        assert fetch.calls == stopped_at + 1
    finally:
        await c.aclose()


async def test_without_idle_after_it_scrapes_all_the_time() -> None:
    fetch = CountingFetch()
    c = ServiceCollector(fetch, clock=Clock(), interval=0.01, idle_after=None)
    c.configure([Source("filters", "127.0.0.1:1")])
    c.start()
    try:
        await _settle()
        assert fetch.calls > 1
    finally:
        await c.aclose()
