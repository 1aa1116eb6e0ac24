"""LoRA adapters, side by side (issue 40): a zipf mix over ``--adapters`` adapters on replicas
with ``--lora-slots`` GPU slots each, through three routers, each in front of its own fresh
emulators (``--enable-lora``, every adapter registered with ``--lora-paths``, a slot load
costing ``--lora-load-ms``).

Arms:
- ``tokenweir-lora``: ``tokenweir up`` with ``pools.chat.lora`` and the ``lora`` plugin
  (adapter affinity, filters/plugins/lora);
- ``round-robin``: PyPI ``sglang-router --policy round_robin``;
- ``sglang-router``: PyPI ``sglang-router --policy cache_aware`` (its default; it routes by the
  request text's prefix and does not know adapters).

Every arm's client names the adapter as SGLang reads it, ``model: "base:adapter"``; each adapter
has its own system prompt (the app built on it), users' questions vary. Open loop: the same
seeded Poisson send times and the same adapter sequence for every arm.

Measured per arm: adapter slot loads per 1,000 requests (the emulators'
``sglang:lora_slot_loads_total``), client TTFT p50/p99, failures.

    nice -n 5 .venv/bin/python bench/routing.py --workload lora --requests 300 --rate 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.routing_client import MODEL, arrivals, one  # noqa: E402
from runtime.children import Child, wait_child_line, wait_child_port  # noqa: E402
from runtime.ports import free_port  # noqa: E402

__all__ = ["LORA_ARMS", "lora_jobs", "run_lora"]

LORA_ARMS = ("tokenweir-lora", "round-robin", "sglang-router")
LoraJob = tuple[str, str, int]  # (adapter, prompt, max tokens)


def lora_jobs(n: int, adapters: int, zipf_s: float, seed: int) -> list[LoraJob]:
    """``n`` requests: adapter ``a{k}`` with probability ~ 1/(k+1)^s, its system prompt, a
    question."""
    rng = random.Random(f"lora-jobs-{seed}")
    weights = [1.0 / (k + 1) ** zipf_s for k in range(adapters)]
    words = [
        "data",
        "query",
        "report",
        "invoice",
        "ticket",
        "refund",
        "policy",
        "contract",
        "clause",
        "table",
        "join",
    ]
    out = []
    for _ in range(n):
        k = rng.choices(range(adapters), weights)[0]
        system = f"You are assistant a{k}. " + " ".join(
            words[(k + i) % len(words)] for i in range(60)
        )
        question = " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))
        out.append((f"a{k}", f"{system}\n{question}", rng.randint(16, 64)))
    return out


class LoraPool:
    def __init__(self, run_dir: Path, label: str, a: argparse.Namespace) -> None:
        self.run_dir, self.label, self.a = run_dir, label, a
        self.ports: list[int] = []
        self.children: list[Child] = []

    async def start(self) -> None:
        a = self.a
        paths = [f"a{k}=/adapters/a{k}" for k in range(a.adapters)]
        for i in range(a.replicas):
            port = free_port()
            argv = [
                sys.executable, "-m", "backends.emulator", "--host", "127.0.0.1",
                "--port", str(port), "--model", MODEL, "--profile", a.profile,
                "--time-scale", str(a.time_scale), "--log-level", "WARNING", "--seed", str(i),
                "--enable-lora", "--max-loras-per-batch", str(a.lora_slots),
                "--lora-load-ms", str(a.lora_load_ms), "--lora-paths", *paths,
            ]  # fmt: skip
            child = Child(f"r{i}-{self.label}", argv, self.run_dir / f"r{i}-{self.label}.log")
            child.start()
            self.children.append(child)
            self.ports.append(port)
        for port, child in zip(self.ports, self.children, strict=True):
            await wait_child_port("127.0.0.1", port, child, timeout=60)

    async def loads(self) -> float:
        total = 0.0
        async with aiohttp.ClientSession() as http:
            for p in self.ports:
                async with http.get(f"http://127.0.0.1:{p}/metrics") as r:
                    text = await r.text()
                for fam in text_string_to_metric_families(text):
                    for s in fam.samples:
                        if s.name == "sglang:lora_slot_loads_total":
                            total += s.value
        return total

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.children))


def lora_policy(pool: LoraPool, gw: int, a: argparse.Namespace) -> dict[str, Any]:
    plugins: list[Any] = [{"name": "identity", "settings": {"require": False}}, "tokens", "lora",
                          "usage"]  # fmt: skip
    return {
        "version": 1,
        "control_plane": {"xds": f"127.0.0.1:{free_port()}",
                          "metrics": f"127.0.0.1:{free_port()}", "drain_timeout": "1s"},
        "filters": {"address": f"127.0.0.1:{free_port()}", "metrics_port": free_port(),
                    "message_timeout": "2s"},
        "pools": {"chat": {
            "models": [MODEL],
            "endpoints": [f"127.0.0.1:{p}" for p in pool.ports],
            "health_check": {"interval": "1s", "timeout": "1s"},
            "timeouts": {"connect": "1s", "request": "0s", "stream_idle": "120s"},
            "lora": {"adapters": [f"a{k}" for k in range(a.adapters)], "slots": a.lora_slots},
        }},
        "gateways": {"edge": {"listen": f"127.0.0.1:{gw}", "routes": [
            {"name": "chat", "match": {"prefix": "/v1/"}, "pool": "chat",
             "filters": {"plugins": plugins}},
        ]}},
    }  # fmt: skip


async def _gateway(
    arm: str, pool: LoraPool, run_dir: Path, a: argparse.Namespace
) -> tuple[int, Child]:
    gw = free_port()
    if arm != "tokenweir-lora":
        policy = "round_robin" if arm == "round-robin" else "cache_aware"
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(gw), "--policy", policy, "--worker-urls",
                *(f"http://127.0.0.1:{p}" for p in pool.ports),
                "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                "--log-level", "error"]  # fmt: skip
        child = Child("router", argv, run_dir / f"router-{arm}.log")
        child.start()
        await wait_child_port("127.0.0.1", gw, child, timeout=300)
        await asyncio.sleep(3.0)  # it registers its workers after it listens
        return gw, child
    path = run_dir / f"policy-{arm}.yaml"
    path.write_text(yaml.safe_dump(lora_policy(pool, gw, a), sort_keys=False))
    argv = [str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "-c", str(path), "--run-dir", str(run_dir / f"up-{arm}"), "--drain-timeout", "1"]  # fmt: skip
    child = Child(f"up-{arm}", argv, run_dir / f"up-{arm}.log")
    child.start()
    await wait_child_port("127.0.0.1", gw, child, timeout=400)
    await wait_child_line(child, "tokenweir up: ready", timeout=400)
    await asyncio.sleep(2.0)  # Envoy's health checks find the replicas
    return gw, child


async def _drive(url: str, jobs: list[LoraJob], rate: float, seed: int) -> dict[str, Any]:
    ttfts: list[float] = []
    failed = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def send(job: LoraJob) -> None:
            nonlocal failed
            adapter, prompt, max_tokens = job
            ttft, _, ok, _ = await one(http, url, (prompt, max_tokens), f"{MODEL}:{adapter}")
            if not ok or ttft is None:
                failed += 1
            else:
                ttfts.append(ttft)

        t0 = time.perf_counter()
        tasks = []
        for job, when in zip(jobs, arrivals(len(jobs), rate, seed=seed), strict=True):
            await asyncio.sleep(max(0.0, when - (time.perf_counter() - t0)))
            tasks.append(asyncio.create_task(send(job)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) > 1 else [0.0] * 99
    return {
        "requests": len(jobs),
        "failed": failed,
        "wall_s": wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
        "ttft_p99_ms": 1000 * q[98],
    }


async def _arm(
    arm: str, jobs: list[LoraJob], a: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    pool = LoraPool(run_dir, arm, a)
    child: Child | None = None
    try:
        await pool.start()
        gw, child = await _gateway(arm, pool, run_dir, a)
        res = await _drive(f"http://127.0.0.1:{gw}/v1/chat/completions", jobs, a.rate, a.start)
        loads = await pool.loads()
        res["slot_loads"] = loads
        res["loads_per_1000"] = 1000 * loads / len(jobs)
        return res
    finally:
        if child is not None:
            await child.aclose(2.0)
        await pool.aclose()


async def run_lora(a: argparse.Namespace) -> dict[str, Any]:
    jobs = lora_jobs(a.requests, a.adapters, a.zipf_s, a.start)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tw-routing-lora-", dir=a.run_dir) as tmp:
        for arm in a.lora_arms:
            print(f"arm {arm} ...", flush=True)
            r = results[arm] = await _arm(arm, jobs, a, Path(tmp))
            print(
                f"  loads/1000 {r['loads_per_1000']:.0f}  ttft p50 {r['ttft_p50_ms'] or 0:.0f} "
                f"p99 {r['ttft_p99_ms']:.0f} ms  failed {r['failed']}",
                flush=True,
            )
    keys = ("requests", "rate", "replicas", "adapters", "zipf_s", "lora_slots", "lora_load_ms",
            "profile", "time_scale", "start")  # fmt: skip
    out = {"config": {k: getattr(a, k) for k in keys} | {"arms": a.lora_arms}, "arms": results}
    name = "routing-lora" + (f"-{a.tag}" if a.tag else "")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out
