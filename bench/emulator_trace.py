"""Replay a slice of the Mooncake trace through R emulators under different routing policies.

Shows that the emulator reproduces why affinity routing pays: with the same requests, the same
replicas and the same (finite) caches, a router that keeps a conversation's prefix on one replica
gets more prompt tokens from cache and a lower time to first token than round robin. Requests are
sent straight to the emulators (no Envoy), at the trace's timestamps divided by ``--speedup``;
prompts are the trace's block ids as text (``backends.emulator.trace``), lengths divided by
``--scale``.

Policies: ``round_robin``; ``prefix1``/``prefix2``: hash of the first 1 or 2 block ids (the first
block is a system prompt shared by nearly every request, so ``prefix1`` piles everything onto one
replica, the failure mode noted in REFERENCE.md).

    .venv/bin/python bench/emulator_trace.py --requests 600 --replicas 4 --speedup 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.emulator.trace import (  # noqa: E402
    TraceRecord,
    ideal_cached_tokens,
    load_trace,
    prompt_text,
)
from tests.helpers import ChildProcess, free_port, wait_for_port  # noqa: E402

TRACE = ROOT.parent / "shared" / "workloads" / "mooncake_conversation_trace.jsonl"


def route(policy: str, rec: TraceRecord, i: int, replicas: int) -> int:
    if policy == "round_robin":
        return i % replicas
    depth = {"prefix1": 1, "prefix2": 2}[policy]
    key = ",".join(str(h) for h in rec.hash_ids[:depth]).encode()
    return zlib.crc32(key) % replicas


async def replay(
    urls: list[str], records: list[TraceRecord], policy: str, scale: int, speedup: float
) -> dict[str, float]:
    ttfts: list[float] = []
    prompt = cached = 0
    per_replica = [0] * len(urls)
    t0 = time.monotonic()

    async def one(http: aiohttp.ClientSession, i: int, rec: TraceRecord) -> None:
        nonlocal prompt, cached
        await asyncio.sleep(max(rec.timestamp_ms / 1000 / speedup - (time.monotonic() - t0), 0))
        r = route(policy, rec, i, len(urls))
        per_replica[r] += 1
        body = {
            "model": "m",
            "prompt": prompt_text(rec, scale),
            "max_tokens": max(rec.output_length // scale, 1),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.monotonic()
        first = None
        async with http.post(urls[r] + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.monotonic() - start
                if line.startswith(b"data: {") and b'"usage"' in line:
                    usage = json.loads(line[6:])["usage"]
                    prompt += usage["prompt_tokens"]
                    details = usage["prompt_tokens_details"]
                    cached += details["cached_tokens"] if details else 0
        ttfts.append(first or 0.0)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:
        await asyncio.gather(*(one(http, i, rec) for i, rec in enumerate(records)))
    ttfts.sort()
    return {
        "hit_ratio": cached / prompt,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p99_ms": 1000 * ttfts[int(0.99 * (len(ttfts) - 1))],
        "busiest_replica_share": max(per_replica) / len(records),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--speedup", type=float, default=20.0)
    ap.add_argument("--cache-tokens", type=int, default=40_000, help="per replica (scaled tokens)")
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--policies", default="round_robin,prefix1,prefix2")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "emulator_trace.json")
    a = ap.parse_args()
    records = load_trace(TRACE, limit=a.requests)
    ideal = ideal_cached_tokens(records, a.scale)
    ideal_ratio = sum(c for _, c in ideal) / sum(p for p, _ in ideal)
    print(
        f"{len(records)} requests, scale 1/{a.scale}, one infinite cache would hit {ideal_ratio:.1%}"
    )
    rows = {}
    with tempfile.TemporaryDirectory(prefix="tw-emu-trace-") as tmp:
        for policy in a.policies.split(","):
            children, urls = [], []
            try:
                for i in range(a.replicas):
                    port = free_port()
                    argv = [
                        sys.executable, "-m", "backends.emulator", "--port", str(port),
                        "--profile", a.profile, "--cache-tokens", str(a.cache_tokens),
                        "--seed", str(i), "--log-level", "WARNING",
                    ]  # fmt: skip
                    children.append(ChildProcess(argv, log=Path(tmp) / f"{policy}-{i}.log"))
                    wait_for_port(port, timeout=20)
                    urls.append(f"http://127.0.0.1:{port}")
                r = asyncio.run(replay(urls, records, policy, a.scale, a.speedup))
            finally:
                for c in children:
                    c.close()
            rows[policy] = r
            print(
                f"{policy:12s} hit ratio {r['hit_ratio']:6.1%} (x{r['hit_ratio'] / ideal_ratio:.2f} of "
                f"ideal)  TTFT p50 {r['ttft_p50_ms']:7.1f} ms  p99 {r['ttft_p99_ms']:7.1f} ms  "
                f"busiest replica {r['busiest_replica_share']:.0%} of requests",
                flush=True,
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            {"args": vars(a) | {"out": str(a.out)}, "ideal": ideal_ratio, "rows": rows}, indent=2
        )
    )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
