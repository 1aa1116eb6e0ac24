"""The in-stream stop's cost, side by side in one run (docs/quotas.md, "The in-stream stop").

In-process, the usage plugin over streams of ``--tokens`` one-token chunks (SSE events as SGLang
sends them): CPU per chunk with ``stop_at_budget`` off, on with a reservation that covers the
answer (counting only), and on with a reservation of 8 tokens that draws every token past it in
top-ups of ``--block`` tokens from a real redis-server (``quota/topup.lua``; the
reservation record is written by the rate-limit service's ``reserve.lua``), plus the latency of
one top-up. The Python meter's own cost (one ext_proc message per chunk, against Envoy's Lua
meter) is measured by ``bench/filters_bench.py`` (``/s/`` vs ``/sp/``). Results:
``bench/results/stream_stop.json`` and a table on stdout.

``.venv/bin/python bench/stream_stop_bench.py [--tokens 300] [--streams 200] [--block 128]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from filters.api import Context, RouteInfo  # noqa: E402
from filters.bodies import parse_request  # noqa: E402
from filters.plugins.usage.plugin import UsagePlugin  # noqa: E402
from filters.services import default_services  # noqa: E402
from policy import load_policy  # noqa: E402
from quota.keys import bucket_key, record_key  # noqa: E402
from quota.topup import TopUps  # noqa: E402
from ratelimit_service.limiter import Check  # noqa: E402
from ratelimit_service.store import load_script, reserve_args  # noqa: E402
from tests.helpers import redis_server  # noqa: E402

ROUTE = RouteInfo(name="llm", pool="chat", rate_limited=True)
HEAD = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'


def chunks(n: int) -> list[bytes]:
    out = [f'data: {HEAD}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}}}}]}}\n\n'
           .encode()]  # fmt: skip
    for i in range(n):
        out.append(
            f'data: {HEAD}"choices":[{{"index":0,"delta":{{"content":" w{i}"}}}}]}}\n\n'.encode()
        )
    out.append(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
               b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d}}\n\n'
               b"data: [DONE]\n\n" % n)  # fmt: skip
    return out


def ctx_for(i: int, reserve_completion: int) -> Context:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    ctx = Context(route=ROUTE, started=time.monotonic(), request_id=f"r{i}", tenant="t")
    ctx.body = parse_request("chat", json.dumps(body).encode())
    ctx.stream, ctx.client_wants_usage, ctx.model = True, True, "m"
    ctx.prompt_tokens, ctx.max_tokens, ctx.reserve = 9, 100_000, 9 + reserve_completion
    return ctx


async def run_arm(plugin: UsagePlugin, stream: list[bytes], streams: int, reserve: int,
                  before: Any = None) -> float:  # fmt: skip
    """CPU seconds per chunk over ``streams`` streams (process time: the top-ups' waits on
    Redis are not CPU)."""
    cpu = 0.0
    for i in range(streams):
        ctx = ctx_for(i, reserve)
        if before is not None:
            await before(ctx)
        t0 = time.process_time()
        for j, c in enumerate(stream):
            await plugin.response_chunk(ctx, c, j == len(stream) - 1)
        await plugin.stream_end(ctx)
        cpu += time.process_time() - t0
    return cpu / (streams * len(stream))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    policy = load_policy(ROOT / "examples" / "mesh.yaml")
    stream = chunks(a.tokens)
    with redis_server() as port:
        r = aioredis.Redis(port=port)
        sha = await r.script_load(load_script("reserve"))
        topups = TopUps(r, wall=time.time, timeout=1.0)
        svc = replace(default_services(policy, time.monotonic), topups=topups)
        off = UsagePlugin({}, svc)
        on = UsagePlugin({"stop_at_budget": True, "topup_tokens": a.block}, svc)
        big = 10**9

        async def reserve(ctx: Context) -> None:
            assert ctx.reserve is not None
            key = bucket_key("t", "tokens")
            checks = [Check(key, "b", ctx.reserve, big, 0.0, 0, False, True)]
            keys, args = reserve_args(record_key("t", ctx.request_id), True, checks,
                                      int(time.time() * 1e6), 60_000)  # fmt: skip
            await r.evalsha(sha, len(keys), *keys, *args)

        rows: dict[str, list[float]] = {"off": [], "on_counting": [], "on_topups": []}
        for _ in range(a.rounds):  # interleaved: the box is shared
            rows["off"].append(await run_arm(off, stream, a.streams, a.tokens + 10))
            rows["on_counting"].append(await run_arm(on, stream, a.streams, a.tokens + 10))
            rows["on_topups"].append(await run_arm(on, stream, a.streams, 8, reserve))
        lat = []
        await reserve(ctx_for(10**6, 8))
        for _ in range(300):
            t0 = time.perf_counter()
            await topups.topup(record_key("t", "r1000000"), 1)
            lat.append(time.perf_counter() - t0)
        await r.aclose()
    out = {k: statistics.median(v) * 1e6 for k, v in rows.items()}
    out["topup_latency_ms_median"] = statistics.median(lat) * 1e3
    out["topup_latency_ms_p99"] = sorted(lat)[int(len(lat) * 0.99)] * 1e3
    out["settings"] = vars(a)
    res = ROOT / "bench" / "results" / "stream_stop.json"
    res.write_text(json.dumps(out, indent=2) + "\n")
    print(f"usage plugin CPU per chunk (median of {a.rounds} rounds, {a.streams} streams of "
          f"{a.tokens} tokens):")  # fmt: skip
    for k in rows:
        print(f"  {k:12s} {out[k]:7.1f} µs  ({out[k] / out['off']:.2f}x off)")
    print(f"  top-up latency: median {out['topup_latency_ms_median']:.2f} ms, "
          f"p99 {out['topup_latency_ms_p99']:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
