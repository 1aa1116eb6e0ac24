"""Cost and staleness of the pool-state channel (docs/operations.md, "Saturation signal").

For 3 and 30 replicas: a child process serves that many SGLang-shaped ``/metrics`` pages (the
emulator's own exposition, gauges changing on every scrape); this process runs the control
plane's scraper at 250 ms, its API, and one long-polling reader. It reports the control
plane's CPU per scrape round (scraper alone) and the staleness a reader sees: the time from
the start of the scrape round to the state arriving at the reader.

    .venv/bin/python bench/pool_state_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.emulator.metrics import EmulatorMetrics  # noqa: E402
from backends.emulator.scheduler import SchedulerStats  # noqa: E402
from controlplane.saturation.api import pool_routes  # noqa: E402
from controlplane.saturation.fetch import HttpFetcher  # noqa: E402
from controlplane.saturation.scraper import PoolScraper  # noqa: E402
from controlplane.saturation.targets import PoolTargets, ScrapeSettings  # noqa: E402
from poolstate import Capacity  # noqa: E402
from poolstate.reader import PoolStateReader, pools_url  # noqa: E402
from runtime.metrics_http import MetricsServer  # noqa: E402


async def serve(n: int) -> None:
    """Child: n replicas' /metrics on free ports; prints the ports as one JSON line."""
    runners, ports = [], []
    for i in range(n):
        count = [0]
        metrics = EmulatorMetrics("m")

        def stats(count: list[int] = count) -> SchedulerStats:
            count[0] += 1
            return SchedulerStats(count[0] % 7, count[0] % 3, 1000, 100_000, 0.01, 0.3, 800.0, 0)

        metrics.bind(stats)

        async def page(_r: web.Request, m: EmulatorMetrics = metrics) -> web.Response:
            return web.Response(body=m.render(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", page)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        runners.append(runner)
        del i
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


async def measure(n: int, seconds: float) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(n)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        eps = tuple(f"127.0.0.1:{p}" for p in ports)
        scraper = PoolScraper(HttpFetcher(), clock=time.monotonic, wall_clock=time.time)
        scraper.configure(
            ScrapeSettings(0.25, 0.2, 1.0),
            {"chat": PoolTargets(eps, Capacity(max_running_requests=8, max_queued_requests=8))},
        )
        await scraper.scrape_once()  # warm: connections open, server info tried
        rounds, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await scraper.scrape_once()
            rounds += 1
            await asyncio.sleep(0.25)
        cpu_ms = (time.process_time() - cpu0) / rounds * 1000
        api = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, routes=pool_routes(scraper))
        port = await api.start()
        reader = PoolStateReader(pools_url("127.0.0.1", port), clock=time.monotonic)
        lags: list[float] = []
        scraper.start()
        reader.start()
        end = time.monotonic() + seconds
        seen = 0
        while time.monotonic() < end:
            state = await reader.wait_update(1.0)
            if state.version != seen and not reader.stale:
                seen = state.version
                lags.append((time.time() - state.ts) * 1000)
        await reader.aclose()
        await scraper.aclose()
        await api.aclose()
        lags = lags[1:]
        return {
            "replicas": n,
            "cpu_ms_per_round": round(cpu_ms, 2),
            "cpu_share_at_250ms": round(cpu_ms / 250, 4),
            "staleness_p50_ms": round(statistics.median(lags), 1),
            "staleness_p95_ms": round(statistics.quantiles(lags, n=20)[-1], 1),
            "staleness_max_ms": round(max(lags), 1),
            "states_seen": len(lags),
        }
    finally:
        child.terminate()
        child.wait(5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--serve", type=int)
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    if a.serve:
        asyncio.run(serve(a.serve))
        return
    for n in (3, 30):
        print(json.dumps(asyncio.run(measure(n, a.seconds))), flush=True)


if __name__ == "__main__":
    main()
