"""Safe retries benchmark (issue 15): backend tokens a retry-heavy workload costs without and
with idempotency keys + request collapsing, and how fast a faulty canary is rolled back.

    .venv/bin/python bench/safe_retries.py            # about 3 minutes here
    .venv/bin/python bench/safe_retries.py --clients 8 --rollbacks 0   # a smoke run

Each arm runs on a fresh stack (real Envoy, control plane, filter server, rate-limit service,
Redis, one SGLang emulator; the integration tests' harness). The workload: ``--clients`` clients,
``--prompts`` distinct deterministic prompts (temperature 0) among them (popular questions),
streamed; every client sends its own Idempotency-Key and
  * a third lose the answer after it completed and retry it once (same key, same body);
  * a third are impatient: 150 ms after sending they send the same request again (same key)
    and take whichever answer completes; a 409 is retried after its Retry-After;
  * the rest send once.
Backend work is read from the emulator's counters (prompt + generated tokens, finished
requests). Rollback: a canary at weight 50 under light traffic, a fault injected into the canary
replica (500s, then a 200x slow-down), time until the control plane reports weight 0.
Writes ``bench/results/safe_retries.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tests.helpers import redis_server  # noqa: E402
from tests.integration.safety_stack import SafetyStack, safety_stack  # noqa: E402

_TOKENS = re.compile(
    r"^sglang:(prompt_tokens_total|generation_tokens_total|num_requests_total)\{[^}]*\}\s+(\S+)$",
    re.M,
)
PLAIN = "identity, tokens, lane, usage"
SAFE = "identity, idempotency, tokens, collapse, lane, usage"


async def backend_work(st: SafetyStack) -> dict[str, float]:
    out = {"prompt_tokens_total": 0.0, "generation_tokens_total": 0.0, "num_requests_total": 0.0}
    for port in st.replicas:
        async with st.session.get(f"http://127.0.0.1:{port}/metrics") as r:
            for name, value in _TOKENS.findall(await r.text()):
                out[name] += float(value)
    return out


async def attempt(st: SafetyStack, body: bytes, key: str) -> tuple[int, bytes]:
    for _ in range(20):  # a 409 (still running) is retried after its Retry-After
        async with st.session.post(
            st.url + "/v1/chat/completions", data=body,
            headers=st.headers(**{"idempotency-key": key}),
        ) as r:  # fmt: skip
            data = await r.read()
            if r.status != 409:
                return r.status, data
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
    return 409, b""


async def client(st: SafetyStack, i: int, prompts: int, rng: random.Random) -> bool:
    body = json.dumps(
        {
            "model": "m1",
            "temperature": 0,
            "stream": True,
            "max_tokens": 48,
            "messages": [{"role": "user", "content": f"question {i % prompts}"}],
        }
    )
    key, kind = f"client-{i}-{rng.random():.6f}", i % 3
    if kind == 1:  # impatient: a second copy 150 ms later, first answer wins
        first = asyncio.create_task(attempt(st, body.encode(), key))
        await asyncio.sleep(0.15)
        second = asyncio.create_task(attempt(st, body.encode(), key))
        results = await asyncio.gather(first, second)
        return any(s == 200 for s, _ in results)
    status, _ = await attempt(st, body.encode(), key)
    if kind == 0:  # the answer was lost on the way back: retry once
        status, _ = await attempt(st, body.encode(), key)
    return status == 200


async def arm(plugins: str, args: argparse.Namespace, redis_port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with safety_stack(Path(tmp), redis_port, slow=20, plugins=plugins) as st:
            before = await backend_work(st)
            rng = random.Random(15)
            t0 = time.monotonic()
            ok = await asyncio.gather(*(client(st, i, args.prompts, rng)
                                        for i in range(args.clients)))  # fmt: skip
            took = time.monotonic() - t0
            await asyncio.sleep(1.0)
            after = await backend_work(st)
            work = {k: after[k] - before[k] for k in after}
            saved = {
                how: st.metric("tokenweir_filters_backend_tokens_saved_total", route="llm", how=how)
                for how in ("idempotency", "collapse")
            }
            return {"plugins": plugins, "ok": sum(ok), "clients": args.clients,
                    "seconds": round(took, 2), "backend": work, "saved_metric": saved}  # fmt: skip


async def rollback(fault: dict[str, Any], redis_port: int) -> float:
    canary = (
        "weight: 50, rollback: {interval: 200ms, window: 3s, min_requests: 5, "
        "max_error_rate: 0.2, max_ttft_ratio: 3, max_tbt_ratio: 3, latency_floor: 20ms}"
    )
    body = json.dumps({"model": "m1", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        async with safety_stack(Path(tmp), redis_port, canary_replicas=1, canary=canary,
                                plugins="identity, canary, tokens, lane, usage") as st:  # fmt: skip
            port = st.mesh.plane.settings.metrics.port
            url = f"http://127.0.0.1:{st.replicas[-1]}/_emulator/faults"
            async with st.session.post(url, json=fault) as r:
                assert r.status == 200
            t0, n = time.monotonic(), 0
            while time.monotonic() - t0 < 60:
                for _ in range(4):  # light traffic: 4 sessions per round
                    n += 1
                    headers = st.headers(**{"x-session-id": f"s{n}"})
                    async with st.session.post(st.url + "/v1/chat/completions", data=body,
                                               headers=headers) as r:  # fmt: skip
                        await r.read()
                async with st.session.get(f"http://127.0.0.1:{port}/api/v1/canary") as r:
                    if (await r.json())["pools"]["chat"]["weight"] == 0:
                        return round(time.monotonic() - t0, 2)
            return float("nan")


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--rollbacks", type=int, default=1, help="rollback runs per fault")
    p.add_argument("--out", type=Path, default=HERE / "results" / "safe_retries.json")
    args = p.parse_args()
    with redis_server() as redis_port:
        plain = await arm(PLAIN, args, redis_port)
        safe = await arm(SAFE, args, redis_port)
        rollbacks: dict[str, list[float]] = {"error_rate=1": [], "slow=200": []}
        for _ in range(args.rollbacks):
            rollbacks["error_rate=1"].append(await rollback({"error_rate": 1.0}, redis_port))
            rollbacks["slow=200"].append(await rollback({"slow": 200}, redis_port))

    def tokens(a: dict[str, Any]) -> float:
        return a["backend"]["prompt_tokens_total"] + a["backend"]["generation_tokens_total"]

    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "plain": plain,
        "safe": safe,
        "backend_tokens_saved_pct": round(100 * (1 - tokens(safe) / tokens(plain)), 1),
        "rollback_seconds": rollbacks,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
