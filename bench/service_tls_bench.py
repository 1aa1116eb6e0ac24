"""The cost of mTLS on the ext_proc hop (Envoy → filter server), plain vs TLS in one run.

Each round starts the control plane, one Envoy, the filter server (``--transport h2``, one
process, plugins ``identity, tokens, lane``) and a fake OpenAI backend, then drives
``--concurrency`` closed-loop clients for ``--seconds``; the arms alternate (plain, mtls, plain,
mtls, …) so drift on a shared box hits both. Reported per arm: requests/s, median and p99
latency, and CPU ms per request of Envoy and of the filter server (``bench/peers_cpu.py``).
Envoy keeps its HTTP/2 connections to the filter server open, so the handshake is paid once per
connection: what is measured is the record encryption per ext_proc message.

``.venv/bin/python bench/service_tls_bench.py [--seconds 8] [--rounds 2] [--concurrency 16]``
writes bench/results/service_tls_bench.json and prints a table.
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

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers_cpu import per_request_ms, snapshot  # noqa: E402
from controlplane.tls_material import make_ca, make_cert  # noqa: E402
from tests.filters.fake_openai import FakeOpenAI  # noqa: E402
from tests.helpers import ChildProcess, free_port, wait_for_port  # noqa: E402
from tests.integration.mesh_harness import mesh  # noqa: E402

POLICY = """
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 2s{tls}}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:{backend}]
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: llm, match: {{prefix: /v1/}}, pool: chat, filters: {{plugins: [identity, tokens, lane]}}}}
tiers:
  small: {{max_tokens: 100}}
tenants:
  carol: {{tier: small, api_keys: [carol-key-123]}}
"""


async def _load(url: str, seconds: float, concurrency: int) -> tuple[int, list[float], int]:
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi there"}]})
    headers = {"authorization": "Bearer carol-key-123", "content-type": "application/json"}
    lat: list[float] = []
    errors = 0
    end = time.monotonic() + seconds

    async def client(s: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with s.post(url, data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    continue
            lat.append(time.perf_counter() - t0)

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(client(s) for _ in range(concurrency)))
    return len(lat), lat, errors


async def _round(tmp: Path, arm: str, tls: str, seconds: float, concurrency: int) -> dict[str, Any]:
    backend = FakeOpenAI(name="b", record=False)
    await backend.start()
    gw, fp = free_port(), free_port()
    text = POLICY.format(fp=fp, backend=backend.port, gw=gw, tls=tls if arm == "mtls" else "")
    work = Path(tempfile.mkdtemp(dir=tmp))
    child = None
    try:
        async with mesh(work, text, {"edge": gw}) as m:
            argv = [sys.executable, "-m", "filters", "--policy", str(m.policy_path),
                    "--transport", "h2", "--processes", "1"]  # fmt: skip
            child = ChildProcess(argv, log=work / "filters.log")
            await asyncio.to_thread(wait_for_port, fp, 20.0)
            url = f"http://127.0.0.1:{gw}/v1/chat/completions"
            await _load(url, 1.0, concurrency)  # warm-up: connections, JITs, caches
            roots = [os.getpid()]  # Envoy and the filter server are our children
            before = snapshot(roots)
            t0 = time.monotonic()
            n, lat, errors = await _load(url, seconds, concurrency)
            wall = time.monotonic() - t0
            cpu = per_request_ms(before, snapshot(roots), n)
    finally:
        if child is not None:
            child.close()
        await backend.aclose()
    lat.sort()
    return {
        "arm": arm,
        "requests": n,
        "errors": errors,
        "rps": round(n / wall, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1000, 2),
        "cpu_ms": {k: v["ms"] for k, v in cpu.items() if k in ("envoy", "filters")},
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ca = make_ca(tmp / "ca")
        srv = make_cert(tmp / "srv", "filters", ca, ips=("127.0.0.1",))
        env = make_cert(tmp / "envoy", "envoy", ca, client=True)
        tls = (f", tls: {{cert: {srv.cert}, key: {srv.key}, ca: {ca.cert}, "
               f"client_cert: {env.cert}, client_key: {env.key}}}")  # fmt: skip
        rows = []
        for i in range(args.rounds):
            for arm in ("plain", "mtls"):
                row = await _round(tmp, arm, tls, args.seconds, args.concurrency)
                row["round"] = i
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for arm in ("plain", "mtls"):
        mine = [r for r in rows if r["arm"] == arm]
        summary[arm] = {
            k: round(statistics.median(r[k] for r in mine), 2) for k in ("rps", "p50_ms", "p99_ms")
        }
        for who in ("envoy", "filters"):
            summary[arm][f"{who}_cpu_ms"] = round(
                statistics.median(r["cpu_ms"].get(who, 0.0) for r in mine), 3
            )
    ratio = {k: round(summary["mtls"][k] / summary["plain"][k], 3) for k in summary["plain"]}
    out = {"args": vars(args), "rows": rows, "median": summary, "mtls_over_plain": ratio}
    dest = ROOT / "bench" / "results" / "service_tls_bench.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'':8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'envoy cpu':>11}{'filters cpu':>13}")
    for arm in ("plain", "mtls"):
        s = summary[arm]
        print(f"{arm:8}{s['rps']:>9}{s['p50_ms']:>9}{s['p99_ms']:>9}"
              f"{s['envoy_cpu_ms']:>11}{s['filters_cpu_ms']:>13}")  # fmt: skip
    print("mtls/plain:", ratio)


if __name__ == "__main__":
    asyncio.run(main())
