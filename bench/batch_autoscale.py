"""Does a batch job buy replicas? (issue 41: batch runs in the capacity interactive leaves idle.)

`tokenweir up --autoscale` on the example policy with its chat pool autoscaled (one emulated
replica to start, at most ``--max`` replicas, ``--slots`` running slots each), no interactive
traffic at all, and one batch job through the Batch API. A runner fills whatever slots it
finds; the online planner must not count its lines as demand (poolstate/valley.py), or the
job asks for more replicas, fills them too, and so on up to ``max_replicas``. Every
``--sample`` seconds the replicas serving (the pool's endpoints file, which ``up`` rewrites)
and the runner's lines in flight are read.

    python bench/batch_autoscale.py --seconds 90 --out bench/results/batch_autoscale.json

Run it on the code before with ``PYTHONPATH=<old tree>`` and that tree's copy of this file
(the processes ``up`` starts inherit it), as docs/benchmarks.md describes.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from batch_mesh import KEY, example_on_free_ports, gauge, lines, start_up, stop_up  # noqa: E402

from runtime.ports import free_port_block  # noqa: E402


def policy_text(max_replicas: int, slots: int) -> tuple[str, dict[str, int]]:
    """The example policy on free ports, no sidecar; pool chat autoscaled."""
    doc, ports = example_on_free_ports()
    chat = doc["pools"]["chat"]
    ports["em"] = free_port_block(max_replicas)
    chat["emulated"].update(replicas=1, profile="seed-2k", base_port=ports["em"], time_scale=1.0)
    chat["endpoints_file"] = "chat.endpoints"
    chat["capacity"] = {"max_running_requests": slots}
    chat["autoscale"] = {
        "min_replicas": 1, "max_replicas": max_replicas, "headroom": 0.3, "interval": "0.5s",
        "window": "10s", "forecast": "5s", "scale_up_cooldown": "1s",
        "scale_down_cooldown": "10s", "scale_down_window": "10s", "load_time": "2s",
        "drain_timeout": "30s",
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False), ports


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


def serving(run: Path) -> int:
    path = run / "chat.endpoints"
    if not path.exists():
        return 0
    return sum(1 for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


async def measure(ns: argparse.Namespace, run: Path, ports: dict[str, int]) -> dict[str, Any]:
    from openai import AsyncOpenAI

    gw = ports["gw"]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key=KEY, max_retries=2)
    f = await client.files.create(
        file=("b.jsonl", io.BytesIO(_jsonl(lines(ns.lines, ns.tokens)))), purpose="batch"
    )
    b = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    runner = f"http://127.0.0.1:{ports['runner']}/metrics"
    samples: list[tuple[float, int, int]] = []  # (t, replicas serving, lines in flight)
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while (t := time.monotonic() - start) < ns.seconds:
            try:
                inflight = int(await gauge(http, runner, "tokenweir_batch_inflight"))
            except (aiohttp.ClientError, TimeoutError):
                inflight = -1
            samples.append((round(t, 2), serving(run), inflight))
            await asyncio.sleep(ns.sample)
    done = await client.batches.retrieve(b.id)
    completed = done.request_counts.completed if done.request_counts else 0
    await client.batches.cancel(b.id)
    reps = [r for _, r, _ in samples]
    return {
        "lines_completed": completed,
        "lines_per_s": round(completed / ns.seconds, 2),
        "replicas_max": max(reps),
        "replicas_mean": round(statistics.mean(reps), 2),
        "replica_seconds": round(sum(reps) * ns.sample, 1),
        "first_above_one_s": next((t for t, r, _ in samples if r > 1), None),
        "mean_lines_in_flight": round(statistics.mean(i for _, _, i in samples if i >= 0), 1),
        "samples": samples,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--tokens", type=int, default=32, help="max_tokens of each line")
    p.add_argument("--max", type=int, default=4, help="autoscale.max_replicas")
    p.add_argument("--slots", type=int, default=8, help="running slots per replica")
    p.add_argument("--sample", type=float, default=0.5)
    p.add_argument("--run-dir", default="/tmp/tokenweir-batch-autoscale")
    p.add_argument("--out", type=Path)
    ns = p.parse_args()
    text, ports = policy_text(ns.max, ns.slots)
    run = Path(ns.run_dir)
    up = start_up(run, text, "--autoscale")
    try:
        result = asyncio.run(measure(ns, run, ports))
    finally:
        stop_up(up)
    out = {"setup": {k: str(v) for k, v in vars(ns).items()}, **result}
    summary = {k: v for k, v in out.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
