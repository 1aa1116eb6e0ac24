"""Shadow pairs benchmark (issue 15): what mirroring every request through the shadow recorder
costs the primary, side by side with no shadow at all.

    flock /tmp/tokenweir-bench.lock nice -n 5 .venv/bin/python bench/shadow_overhead.py

Arms, each on a fresh stack (real Envoy, control plane, filter server, rate-limit service, Redis,
SGLang emulators; the integration tests' harness), run in turn (off, mirror, pairs, off, ...;
``--rounds`` times) so a drift in the machine's load falls on all: ``off`` has no shadow;
``mirror`` mirrors every request with Envoy alone (``shadow: {fraction: 1.0}``, no plugin) to a
shadow emulator as fast as the primary, on the same two cores; ``pairs`` lists the shadow plugin
too (every request sampled, passed through the shadow recorder and paired). ``pairs`` against
``mirror`` is the recorder's own cost; against ``off`` the whole cost on this one box. Each arm sends ``--requests`` streamed chat requests from ``--concurrency`` clients
and measures, at the client, time to first byte and to the end of the stream. Writes
``bench/results/shadow_overhead.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tests.helpers import redis_server  # noqa: E402
from tests.integration.safety_stack import SafetyStack, safety_stack  # noqa: E402

PLAIN = "identity, tokens, lane, usage"
SHADOW = "identity, tokens, lane, shadow, usage"
MODES = ("off", "mirror", "pairs")


async def one(st: SafetyStack, i: int) -> tuple[float, float]:
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": f"q {i % 50}"}],
                       "max_tokens": 16, "stream": True}).encode()  # fmt: skip
    t0 = time.perf_counter()
    async with st.session.post(
        st.url + "/v1/chat/completions", data=body, headers=st.headers()
    ) as r:
        assert r.status == 200, await r.text()
        await r.content.readany()
        first = time.perf_counter() - t0
        await r.read()
    return first, time.perf_counter() - t0


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def arm(mode: str, args: argparse.Namespace, redis_port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with safety_stack(Path(tmp), redis_port, shadow_replicas=0 if mode == "off" else 1,
                                plugins=SHADOW if mode == "pairs" else PLAIN) as st:  # fmt: skip
            for i in range(10):  # warm-up: connections, caches
                await one(st, i)
            sem = asyncio.Semaphore(args.concurrency)

            async def go(i: int) -> tuple[float, float]:
                async with sem:
                    return await one(st, i)

            cpu0 = os.times()
            got = await asyncio.gather(*(go(i) for i in range(args.requests)))
            cpu1 = os.times()
            pairs = st.metric("tokenweir_filters_shadow_pairs_total", route="llm")
            await asyncio.sleep(1.0)
            pairs = st.metric("tokenweir_filters_shadow_pairs_total", route="llm")
    ttfb = [g[0] for g in got]
    total = [g[1] for g in got]
    return {
        "mode": mode,
        "requests": len(got),
        "ttfb_p50_ms": round(statistics.median(ttfb) * 1000, 2),
        "ttfb_p95_ms": round(_q(ttfb, 0.95) * 1000, 2),
        "total_p50_ms": round(statistics.median(total) * 1000, 2),
        "total_p95_ms": round(_q(total, 0.95) * 1000, 2),
        "filter_process_cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 3),
        "pairs_recorded": pairs,
    }


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2, help="off/on pairs of arms")
    args = p.parse_args()
    load = os.getloadavg()
    runs = []
    with redis_server() as redis_port:
        for mode in MODES * args.rounds:
            runs.append(await arm(mode, args, redis_port))
            print(json.dumps(runs[-1]))

    def mean(mode: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs if r["mode"] == mode)

    keys = ("ttfb_p50_ms", "ttfb_p95_ms", "total_p50_ms", "total_p95_ms", "filter_process_cpu_s")
    summary: dict[str, Any] = {k: {m: round(mean(m, k), 3) for m in MODES} for k in keys}
    for k in keys:
        summary[k]["pairs/off"] = round(mean("pairs", k) / mean("off", k), 3)
        summary[k]["pairs/mirror"] = round(mean("pairs", k) / mean("mirror", k), 3)
    out = {"load_average_at_start": [round(x, 2) for x in load], "args": vars(args),
           "runs": runs, "summary": summary,
           "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "shadow_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
