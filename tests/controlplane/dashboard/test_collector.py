"""The dashboard's collector scrapes all the time, keeps a bounded history, and reads the
connected Envoys' stats as they come and go."""

from __future__ import annotations

import asyncio

from controlplane.dashboard.collector import ServiceCollector, Source
from controlplane.dashboard.summary import totals_of

FILTERS = 'tokenweir_filters_streams_total{route="llm"} %d\n'
ENVOY = (
    "# TYPE envoy_cluster_upstream_rq_xx counter\n"
    'envoy_cluster_upstream_rq_xx{envoy_response_code_class="2",envoy_cluster_name="pool_chat"} 7\n'
)


class Fetch:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def metrics(self, endpoint: str, timeout_s: float, path: str = "/metrics") -> str:
        self.calls.append((endpoint, path))
        return ENVOY if path != "/metrics" else FILTERS % len(self.calls)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0.02)


async def test_it_scrapes_with_nobody_reading_and_keeps_a_bounded_history() -> None:
    fetch, clock = Fetch(), Clock()
    c = ServiceCollector(fetch, clock=clock, interval=0.01, window=1, history_s=0.05,
                         recent_s=0.03)  # fmt: skip
    c.configure([Source("filters#0", "127.0.0.1:1")])
    c.start()
    try:
        for _ in range(20):  # nobody calls anything: the loop collects on its own
            clock.now += 0.01
            await asyncio.sleep(0.01)
        await _settle()
    finally:
        await c.aclose()
    assert c.rounds >= 10
    assert len(c.points) == 5  # 0.05 s of history at 0.01 s a point, no more
    assert [p.t for p in c.points] == sorted(p.t for p in c.points)
    assert c.points[-1].requests_per_s > 0  # the counter rose every round
    then = c.since()
    assert then is not None and clock.now - then[0] <= 0.03 + 0.01 + 1e-9


async def test_envoys_are_scraped_at_their_stats_path_while_connected() -> None:
    fetch, clock = Fetch(), Clock()
    envoys = [Source("envoy edge-0", "127.0.0.1:9901", "/stats/prometheus?usedonly")]
    c = ServiceCollector(fetch, clock=clock, more=lambda: list(envoys))
    c.configure([Source("filters#0", "127.0.0.1:1")])
    await c.scrape_once()
    assert ("127.0.0.1:9901", "/stats/prometheus?usedonly") in fetch.calls
    assert c.totals.upstream == {("pool_chat", "2xx"): 7.0}
    assert [(s["name"], s["ok"]) for s in c.sources()] == [("filters#0", True),
                                                           ("envoy edge-0", True)]  # fmt: skip
    envoys.clear()  # the Envoy went away: no longer scraped or listed
    await c.scrape_once()
    assert [s["name"] for s in c.sources()] == ["filters#0"]
    assert c.totals.upstream == {}


def test_only_the_read_lines_are_parsed() -> None:
    noise = "".join(f'tokenweir_filters_other_total{{x="{i}"}} 1\n' for i in range(100))
    t = totals_of([noise + 'tokenweir_admission_limit{pool="chat"} 12.0\n' + ENVOY])
    assert t.limit == {"chat": 12.0} and t.upstream == {("pool_chat", "2xx"): 7.0}
