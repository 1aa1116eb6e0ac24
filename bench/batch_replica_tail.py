"""Interactive TTFT straight at one emulated replica, alone and beside closed-loop batch streams
(issue 41): how much of the batch arm's interactive tail in ``bench/batch_valleys.py`` the
replica itself makes, with no gateway in the way.

One emulator (``--profile``, 64 slots, priority scheduling, ``--time-scale``); 40 streamed
interactive probes at priority 100, one every 0.35 s, first alone, then beside ``--batch``
non-streamed batch requests at priority 0 kept running back to back (64 tokens each, as the
runner's lines). Prints TTFT p50 / p95 / max per phase and the emulator's CPU (cores, from
/proc), and writes them as JSON to ``--out``.

    python bench/batch_replica_tail.py --out bench/results/batch_replica_tail.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.ports import free_port  # noqa: E402

PROBES, GAP_S = 40, 0.35


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def batch(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    body = {"model": "m", "max_tokens": 64, "priority": 0,
            "messages": [{"role": "user", "content": "line 7 of the batch job, please"}]}  # fmt: skip
    while not stop.is_set():
        async with http.post(url, json=body) as r:
            await r.read()


async def probe(http: aiohttp.ClientSession, url: str, i: int) -> float:
    body = {"model": "m", "max_tokens": 64, "stream": True, "priority": 100,
            "messages": [{"role": "user", "content": f"question {i}: " + "word " * 40}]}  # fmt: skip
    start, first = time.monotonic(), float("nan")
    async with http.post(url, json=body) as r:
        async for chunk in r.content.iter_any():
            if b"content" in chunk:
                first = time.monotonic() - start
                break
        await r.read()
    return first


async def phase(http: aiohttp.ClientSession, url: str, pid: int) -> dict[str, float]:
    c0, t0 = cpu_s(pid), time.monotonic()
    tasks = []
    for i in range(PROBES):
        tasks.append(asyncio.create_task(probe(http, url, i)))
        await asyncio.sleep(GAP_S)
    ttft = sorted(await asyncio.gather(*tasks))
    return {
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p95_ms": round(1000 * ttft[int(0.95 * len(ttft))], 1),
        "ttft_max_ms": round(1000 * ttft[-1], 1),
        "emulator_cpu_cores": round((cpu_s(pid) - c0) / (time.monotonic() - t0), 3),
    }


async def main_async(ns: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m",
            "--profile", ns.profile, "--time-scale", str(ns.time_scale),
            "--max-running-requests", "64", "--enable-priority-scheduling"]  # fmt: skip
    emu = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        wait_for_port(port, timeout=30)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            alone = await phase(http, url, emu.pid)
            stop = asyncio.Event()
            streams = [asyncio.create_task(batch(http, url, stop)) for _ in range(ns.batch)]
            await asyncio.sleep(3.0)  # the batch running
            beside = await phase(http, url, emu.pid)
            stop.set()
            await asyncio.gather(*streams)
    finally:
        emu.terminate()
        emu.wait()
    return {"setup": {k: v for k, v in vars(ns).items() if k != "out"}, "alone": alone,
            "beside_batch": beside}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", default="llama-3.1-8b-h200")
    p.add_argument("--time-scale", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=50, help="batch streams kept running")
    p.add_argument("--out", type=Path)
    ns = p.parse_args()
    result = asyncio.run(main_async(ns))
    print(json.dumps(result, indent=2))
    if ns.out is not None:
        ns.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
