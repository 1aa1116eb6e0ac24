"""What tracing costs the rate-limit service's hot path, side by side in one run (docs/tracing.md).

1. The servicer with tracing off: the h2 transport's entry (``handle_bytes_traced``, which now
   checks the live switch per call) against the plain ``handle_bytes`` it used to get, on a
   decider with the in-memory store (no I/O: the Python cost alone).
2. The reserve script on a real redis-server: a reservation that keeps the request's
   ``traceparent`` (one more ARGV, one HSET inside the same call) against one that does not.

    .venv/bin/python -m bench.tracing_cost [--calls 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import redis.asyncio as aioredis

from policy.loader import load_policy_text
from ratelimit_service.decider import Decider, DeciderSettings
from ratelimit_service.directory import QuotaDirectory
from ratelimit_service.limiter import Check
from ratelimit_service.metrics import Metrics
from ratelimit_service.server import RateLimitServicer
from ratelimit_service.store import MemoryStore, RedisStore
from tests.helpers import redis_server
from tests.ratelimit_service import rls

POLICY = """
version: 1
ratelimit: {address: 127.0.0.1:7001}
filters: {address: 127.0.0.1:7002}
pools: {chat: {models: [m], endpoints: [127.0.0.1:9001]}}
gateways:
  edge:
    listen: 127.0.0.1:10000
    routes: [{name: llm, pool: chat, rate_limit: {enabled: true}, filters: {plugins: [identity, tokens, usage]}}]
tiers: {t: {quotas: {tokens: {burst: 1000000000, refill_per_second: 1000000}}}}
tenants: {acme: {tier: t}}
"""
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def servicer_off(calls: int) -> tuple[float, float]:
    """CPU µs per call (this process's CPU time: other processes' load counts less):
    (plain handle_bytes, handle_bytes_traced with tracing off)."""
    policy = load_policy_text(POLICY)
    decider = Decider(
        DeciderSettings(), directory=QuotaDirectory(policy, None), store=MemoryStore(),
        health=None, metrics=Metrics(),
    )  # fmt: skip
    servicer = RateLimitServicer(decider)
    msgs = [rls.llm("acme", 10, rid=f"r{i}", model="m").SerializeToString() for i in range(calls)]
    meta = (("traceparent", TP),)
    took = {False: 0.0, True: 0.0}
    for rnd in range(6):  # interleaved rounds, alternating order: load and warm-up hit both alike
        for off in (False, True) if rnd % 2 else (True, False):
            t0 = time.process_time()
            if off:
                for m in msgs:
                    await servicer.handle_bytes_traced(m, meta)
            else:
                for m in msgs:
                    await servicer.handle_bytes(m)
            took[off] += time.process_time() - t0
    return took[False] / (6 * calls) * 1e6, took[True] / (6 * calls) * 1e6


async def reserve_script(calls: int) -> tuple[float, float]:
    """µs per reservation round trip on Redis: (without a trace, with one)."""
    with redis_server() as port:
        client = aioredis.Redis(port=port)
        store = RedisStore(client, deadline=5.0)
        run = uuid.uuid4().hex[:8]
        checks = [Check(f"tw:{{{run}}}:b:tokens", "b", 10, 10**12, 1e6, 0, False, True)]
        out = {False: 0.0, True: 0.0}
        try:
            for rnd in range(6):
                for traced in (False, True) if rnd % 2 else (True, False):
                    t0 = time.perf_counter()
                    for i in range(calls // 6):
                        rec = f"tw:{{{run}}}:r:{rnd}-{traced}-{i}"
                        now = int(time.time() * 1e6)
                        await store.reserve(rec, True, checks, now, 60_000, TP if traced else None)
                    out[traced] += time.perf_counter() - t0
            info = await client.info("memory")
        finally:
            await store.aclose()
            await client.aclose()
    n = 6 * (calls // 6)
    print(f"  redis used_memory after the run: {info['used_memory_human']}")
    return out[False] / n * 1e6, out[True] / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    plain, off = asyncio.run(servicer_off(args.calls))
    print(f"servicer, tracing off: handle_bytes {plain:.1f} µs/call, "
          f"handle_bytes_traced (switch off) {off:.1f} µs/call, ratio {off / plain:.3f}")  # fmt: skip
    bare, kept = asyncio.run(reserve_script(args.calls // 4))
    print(f"reserve.lua round trip: no trace {bare:.1f} µs, trace kept {kept:.1f} µs, "
          f"ratio {kept / bare:.3f} (one call each: no extra round trip)")  # fmt: skip


if __name__ == "__main__":
    main()
