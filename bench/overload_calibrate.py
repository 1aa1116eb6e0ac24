"""Between the overload benchmark's runs (``bench/overload.py``): measure a fresh pool's capacity
(a closed loop holding every slot busy, straight to the replicas), and wait until an arm's pool
and gateway are idle with cold caches before the next run."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
from overload_arms import MODEL, Arm, EmulatorPool, PoolSpec
from overload_scrape import scrape
from overload_workload import scaled_lengths

from backends.emulator.trace import prompt_text

__all__ = ["calibrate", "wait_idle"]


async def wait_idle(arm: Arm, timeout: float = 90.0) -> bool:
    """Until the pool and the gateway hold nothing, then empty the pool's prefix caches: every
    run starts on an idle pool with cold caches."""
    async with aiohttp.ClientSession() as probe:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            q = await scrape(probe, arm)
            # the reserve gauge keeps its last value until the gateway sees a request again
            busy = sum(v for k, v in q.items() if not k.startswith("gateway_reserved"))
            if busy == 0 and await arm.pool.flush(probe):
                return True
            await asyncio.sleep(0.25)
    return False


async def calibrate(
    spec: PoolSpec,
    records: list[Any],
    seed: int,
    length_scale: int,
    run_dir: Path,
    seconds: float,
    warm: float,
) -> float:
    """The pool's capacity in requests/s, measured: a closed loop holding every slot of a fresh
    pool busy (``replicas x running`` streams, straight to the replicas), completions per second
    after ``warm`` seconds."""
    pool = EmulatorPool(spec, run_dir)
    await pool.start("calibrate")
    rng = random.Random(f"{seed}:calibrate")
    order = [records[i] for i in rng.sample(range(len(records)), len(records))]
    done: list[float] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    counter = iter(range(10**9))

    async def worker(http: aiohttp.ClientSession, url: str) -> None:
        while loop.time() - t0 < warm + seconds:
            rec = order[next(counter) % len(order)]
            _, out = scaled_lengths(rec, length_scale)
            body = {
                "model": MODEL, "messages": [{"role": "user", "content": prompt_text(rec, length_scale)}],
                "max_tokens": out, "ignore_eos": True, "stream": True,
            }  # fmt: skip
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                async for _ in r.content:
                    pass
            done.append(loop.time() - t0)

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(
                *(
                    worker(http, pool.urls[i % spec.replicas])
                    for i in range(spec.replicas * spec.running)
                )
            )
    finally:
        await pool.aclose()
    return sum(1 for t in done if warm <= t < warm + seconds) / seconds
