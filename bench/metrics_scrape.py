"""Rendering ``/metrics`` beside the data path: how late a process's event loop answers while
Prometheus scrapes it, and what a scrape costs, three ways side by side: ``old`` (the page by
``prometheus_client.generate_latest`` in a thread at the interpreter's GIL switch interval, 5 ms:
``MetricsServer`` before), ``switch`` (the same at :data:`runtime.metrics_http.RENDER_SWITCH_INTERVAL`)
and ``new`` (``MetricsServer`` now: ``runtime.metrics_text.TextRenderer`` at that interval).

``.venv/bin/python bench/metrics_scrape.py [--tenants 8 200] [--rounds 5] [--seconds 2]``

A server process holds a filter server's registry (``filters.metrics.FilterMetrics``, every
tenant with the children a streamed request leaves: TTFT, TBT, tokens/s, tokens, requests,
duration) behind three ``MetricsServer`` s on the same registry, one per arm, and a TCP echo on
the same event loop: the data path's
stand-in, every ping one read and one write on the loop, as a request through the filter server.
A client process pings the echo every 2 ms and measures each round trip while a scraper fetches
one server's page back to back (or nothing: ``idle``). Arms alternate within every round
(``idle`` too: no scrape); medians over the rounds; ``cpu_ms`` is one page's render alone on
an idle loop, median of 7. JSON: ``bench/results/metrics_scrape.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("idle", "old", "switch", "new")


def filled_metrics(tenants: int) -> Any:
    """A filter server's metrics after traffic from ``tenants`` tenants on two lanes."""
    from filters.metrics import FilterMetrics

    m = FilterMetrics()
    for i in range(tenants):
        tenant = f"tenant-{i}"
        for lane in ("interactive", "batch"):
            m.ttft.labels(tenant, "llama-3.1-8b", lane).observe(0.2)
            m.tbt.labels(tenant, "llama-3.1-8b", lane).observe(0.02)
            m.requests.labels("chat", lane, "llama-3.1-8b", tenant, "ok").inc()
        m.tokens_per_second.labels(tenant, "llama-3.1-8b").observe(40)
        for kind in ("prompt", "completion"):
            m.tokens.labels(tenant, "llama-3.1-8b", kind).inc(100)
    for lane in ("interactive", "batch"):
        m.duration.labels("chat", lane, "llama-3.1-8b").observe(1.0)
    return m


async def serve(tenants: int) -> None:
    """The measured process: echo + the two metrics servers; prints its ports, runs until
    stdin closes."""
    from prometheus_client import generate_latest

    from runtime.metrics_http import MetricsServer

    m = filled_metrics(tenants)

    class Library:  # the renderer MetricsServer had before
        def render(self) -> bytes:
            return generate_latest(m.registry)

    servers = {
        "old": MetricsServer(m.registry, render_switch_interval=None),
        "switch": MetricsServer(m.registry),
        "new": MetricsServer(m.registry),
    }
    servers["old"].renderer = servers["switch"].renderer = Library()  # type: ignore[assignment]

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(64):
                w.write(data)
                await w.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass  # the client went away, or the server is closing
        finally:
            w.close()

    srv = await asyncio.start_server(echo, "127.0.0.1", 0)
    ports: dict[str, Any] = {"echo": srv.sockets[0].getsockname()[1]}
    cpu: dict[str, float] = {}
    for name, server in servers.items():
        ports[name] = await server.start()
        times = []
        for _ in range(8):
            t = time.perf_counter()
            server.renderer.render()
            times.append(time.perf_counter() - t)
        cpu[name] = round(1000 * statistics.median(times[1:]), 2)  # the first fills the cache
    ports["cpu_ms"] = cpu
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the client closes our stdin
    for server in servers.values():
        await server.aclose()
    srv.close()


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(ports: dict[str, Any], arm: str, seconds: float) -> dict[str, float]:
    import aiohttp

    reader, writer = await asyncio.open_connection("127.0.0.1", ports["echo"])
    stop = asyncio.Event()
    renders: list[float] = []
    page = 0

    async def scraper() -> None:
        nonlocal page
        if arm == "idle":
            return
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{ports[arm]}/metrics"
            while not stop.is_set():
                t = time.perf_counter()
                async with http.get(url) as r:
                    page = len(await r.read())
                renders.append(time.perf_counter() - t)

    task = asyncio.create_task(scraper())
    rtts: list[float] = []
    end = time.perf_counter() + seconds
    await asyncio.sleep(0.1)
    while time.perf_counter() < end:
        t = time.perf_counter()
        writer.write(b"p")
        await writer.drain()
        await reader.readexactly(1)
        rtts.append(time.perf_counter() - t)
        await asyncio.sleep(0.002)
    stop.set()
    await task
    writer.close()
    out = {
        "rtt_p50_ms": 1000 * _q(rtts, 0.5),
        "rtt_p99_ms": 1000 * _q(rtts, 0.99),
        "rtt_max_ms": 1000 * max(rtts),
        "pings": len(rtts),
    }
    if renders:
        out["scrape_p50_ms"] = 1000 * statistics.median(renders)
        out["scrapes"] = len(renders)
        out["page_bytes"] = page
    return out


async def run_tenants(tenants: int, rounds: int, seconds: float) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(tenants)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        ports = json.loads(child.stdout.readline())
        per: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
        for r in range(rounds):
            for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
                per[arm].append(await measure(ports, arm, seconds))
        child.stdin.close()
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
    summary: dict[str, Any] = {}
    for arm, runs in per.items():
        keys = runs[0].keys()
        summary[arm] = {k: round(statistics.median(x[k] for x in runs), 2) for k in keys}
        summary[arm]["rounds"] = runs
        if arm in ports["cpu_ms"]:
            summary[arm]["cpu_ms"] = ports["cpu_ms"][arm]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tenants", type=int, nargs="+", default=[8, 200])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "metrics_scrape.json")
    a = ap.parse_args(argv)
    if a.serve is not None:
        asyncio.run(serve(a.serve))
        return 0
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average_start": os.getloadavg(),
        "rounds": a.rounds,
        "seconds": a.seconds,
        "tenants": {},
    }
    for n in a.tenants:
        s = asyncio.run(run_tenants(n, a.rounds, a.seconds))
        result["tenants"][str(n)] = s
        for arm in ARMS:
            row = {k: v for k, v in s[arm].items() if k != "rounds"}
            print(f"tenants {n:4} {arm:4} {row}", flush=True)
    result["load_average_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
