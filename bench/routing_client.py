"""The routing benchmark's client (``bench/routing.py``): ``--concurrency`` closed-loop workers
send the jobs as streamed chat completions and time each to its first content chunk; with
``--rate R`` the jobs are sent open loop instead, at seeded Poisson times averaging R per second
(the same times for every arm), so arms are compared at the same offered load: a closed loop
gives a faster arm more load, and its TTFT is then measured under more contention."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import aiohttp

from bench.routing_jobs import Job

__all__ = ["MODEL", "arrivals", "drive", "one"]

MODEL = "llama-3.1-8b"


async def one(
    http: aiohttp.ClientSession, url: str, job: Job, model: str = MODEL
) -> tuple[float | None, int, bool, str | None]:
    """(TTFT s, output tokens, ok, the answer's ``id``) of one streamed chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": job[0]}],
        "max_tokens": job[1],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    out = 0
    rid = None
    try:
        async with http.post(url, json=body) as r:
            if r.status != 200:
                await r.read()
                return None, 0, False, None
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                rid = rid or chunk.get("id")
                if (
                    ttft is None
                    and chunk.get("choices")
                    and chunk["choices"][0]["delta"].get("content")
                ):
                    ttft = time.perf_counter() - t0
                if chunk.get("usage"):
                    out = chunk["usage"].get("completion_tokens", 0)
    except aiohttp.ClientError:  # a stream cut short counts as failed, the run goes on
        return None, 0, False, rid
    return ttft, out, True, rid


def arrivals(n: int, rate: float, *, seed: int) -> list[float]:
    """``n`` send times (s from the start) of a Poisson process of ``rate`` per second; the
    same ``seed`` gives every arm the same times."""
    rng = random.Random(f"routing-arrivals-{seed}")
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def drive(url: str, records: list[Job], a: argparse.Namespace) -> dict[str, Any]:
    queue: asyncio.Queue[tuple[int, Job]] = asyncio.Queue()
    for i, rec in enumerate(records):
        queue.put_nowait((i, rec))
    # (job, sent at s from the run's start, TTFT s, answer id)
    per_request: list[tuple[int, float, float | None, str | None]] = []
    ttfts: list[float] = []
    later: list[float] = []  # the requests after the first wave (each worker's first job)
    tokens = 0
    failed = 0
    taken = 0
    rate = a.rate
    conn = aiohttp.TCPConnector(limit=0 if rate else a.concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:

        async def send(i: int, rec: Job) -> None:
            nonlocal tokens, failed, taken
            first_wave = taken < a.concurrency
            taken += 1
            sent = time.perf_counter() - t0
            ttft, out, ok, rid = await one(http, url, rec)
            per_request.append((i, sent, ttft, rid))
            if not ok:
                failed += 1
            if ttft is not None:
                ttfts.append(ttft)
                if not first_wave:
                    later.append(ttft)
            tokens += out

        async def worker() -> None:
            while not queue.empty():
                await send(*queue.get_nowait())

        async def open_loop(at: list[float]) -> None:
            tasks = []
            for (i, rec), when in zip(enumerate(records), at, strict=True):
                await asyncio.sleep(max(0.0, when - (time.perf_counter() - t0)))
                tasks.append(asyncio.create_task(send(i, rec)))
            await asyncio.gather(*tasks)

        t0 = time.perf_counter()
        if rate:
            await open_loop(arrivals(len(records), rate, seed=a.start))
        else:
            await asyncio.gather(*(worker() for _ in range(a.concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) > 1 else [0.0] * 99
    q_later = statistics.quantiles(later, n=100) if len(later) > 1 else [0.0] * 99
    return {
        "requests": len(records),
        "offered_rate": rate,  # None: closed loop of ``concurrency`` clients
        "failed": failed,
        "wall_s": wall,
        "req_per_s": len(records) / wall,
        "out_tok_per_s": tokens / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
        "ttft_mean_ms": 1000 * statistics.fmean(ttfts) if ttfts else None,
        "ttft_p95_ms": 1000 * q[94],
        "ttft_p99_ms": 1000 * q[98],
        # the same without the first wave: cold connections, streams and caches of a fresh arm
        "ttft_p95_after_first_wave_ms": 1000 * q_later[94],
        "ttft_p99_after_first_wave_ms": 1000 * q_later[98],
        "per_request": per_request,  # joined with the backends' request logs, then dropped
    }
