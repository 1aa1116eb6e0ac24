"""PD disaggregation, side by side (issue 40): the same trace through tokenweir's PD pool and
through sglang-router's PD mode, each in front of its own fresh emulators (``--prefill`` prefill
and ``--decode`` decode servers, ``--disaggregation-mode``).

Arms:
- ``tokenweir-pd``: ``tokenweir up`` with ``pools.chat.disaggregation`` and the ``pd`` plugin
  (the filter server sends the prefill side, Envoy streams the decode side);
- ``sglang-router-pd``: PyPI ``sglang-router --pd-disaggregation`` (``--policy cache_aware``
  for prefill, ``power_of_two`` for decode: its documented PD setup).

``--pd-kill prefill|decode`` SIGKILLs the first prefill or decode server ``--pd-kill-after``
seconds into each arm's run: the run must still end, each request answered or failed.

Measured per arm: client TTFT p50/p95/p99 (streamed chat, to the first content chunk),
requests/s, failures, the decode servers' mean inter-token latency (their own histogram), the
prefill servers' prefix-cache hit ratio.

    nice -n 5 .venv/bin/python bench/routing.py --workload pd --requests 200 --scale 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.emulator.trace import load_trace  # noqa: E402
from bench.routing_client import MODEL, drive  # noqa: E402
from bench.routing_jobs import Job, trace_jobs  # noqa: E402
from runtime.children import Child, wait_child_line, wait_child_port  # noqa: E402
from runtime.ports import free_port  # noqa: E402

__all__ = ["PD_ARMS", "run_pd"]

TRACE = ROOT / "bench" / "data" / "mooncake_conversation_every12th.jsonl"
PD_ARMS = ("tokenweir-pd", "sglang-router-pd")
_SUMS = ("sglang:cached_tokens_total", "sglang:prompt_tokens_total",
         "sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count",
         "sglang:num_requests_total")  # fmt: skip


class PdPool:
    """Fresh prefill and decode emulators."""

    def __init__(self, run_dir: Path, label: str, a: argparse.Namespace) -> None:
        self.run_dir, self.label, self.a = run_dir, label, a
        self.prefill: list[tuple[int, int]] = []  # (http port, bootstrap port)
        self.decode: list[int] = []
        self.children: list[Child] = []

    def _spawn(self, name: str, port: int, *extra: str) -> Child:
        a = self.a
        argv = [
            sys.executable, "-m", "backends.emulator", "--host", "127.0.0.1", "--port", str(port),
            "--model", MODEL, "--profile", a.profile, "--time-scale", str(a.time_scale),
            "--log-level", "WARNING", "--cache-tokens", str(a.cache_tokens // a.scale), *extra,
        ]  # fmt: skip
        child = Child(f"{name}-{self.label}", argv, self.run_dir / f"{name}-{self.label}.log")
        child.start()
        self.children.append(child)
        return child

    async def start(self) -> None:
        waits = []
        for i in range(self.a.prefill):
            port, boot = free_port(), free_port()
            child = self._spawn(f"prefill{i}", port, "--disaggregation-mode", "prefill",
                                "--disaggregation-bootstrap-port", str(boot), "--seed", str(i))  # fmt: skip
            self.prefill.append((port, boot))
            waits += [(port, child), (boot, child)]
        for i in range(self.a.decode):
            port = free_port()
            child = self._spawn(f"decode{i}", port, "--disaggregation-mode", "decode",
                                "--seed", str(i))  # fmt: skip
            self.decode.append(port)
            waits.append((port, child))
        for port, child in waits:
            await wait_child_port("127.0.0.1", port, child, timeout=60)

    async def sums(self, ports: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        async with aiohttp.ClientSession() as http:
            for p in ports:
                try:
                    async with http.get(f"http://127.0.0.1:{p}/metrics") as r:
                        text = await r.text()
                except aiohttp.ClientError:  # a server killed mid-run (--pd-kill)
                    continue
                for fam in text_string_to_metric_families(text):
                    for s in fam.samples:
                        if s.name in _SUMS:
                            out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.children))


def pd_policy(pool: PdPool, gw: int) -> dict[str, Any]:
    plugins: list[Any] = [{"name": "identity", "settings": {"require": False}}, "tokens", "pd",
                          "usage"]  # fmt: skip
    return {
        "version": 1,
        "control_plane": {"xds": f"127.0.0.1:{free_port()}",
                          "metrics": f"127.0.0.1:{free_port()}", "drain_timeout": "1s"},
        "filters": {"address": f"127.0.0.1:{free_port()}", "metrics_port": free_port(),
                    "message_timeout": "2s", "max_body_bytes": "8MiB"},
        "pools": {"chat": {
            "models": [MODEL],
            "max_body_bytes": "8MiB",
            "health_check": {"interval": "1s", "timeout": "1s"},
            "retries": {"enabled": False},
            "timeouts": {"connect": "1s", "request": "0s", "stream_idle": "120s"},
            "disaggregation": {
                "prefill": [{"address": f"127.0.0.1:{p}", "bootstrap_port": b}
                            for p, b in pool.prefill],
                "decode": [f"127.0.0.1:{p}" for p in pool.decode],
            },
        }},
        "gateways": {"edge": {"listen": f"127.0.0.1:{gw}", "routes": [
            {"name": "chat", "match": {"prefix": "/v1/"}, "pool": "chat",
             "filters": {"plugins": plugins}},
        ]}},
    }  # fmt: skip


async def _gateway(arm: str, pool: PdPool, run_dir: Path) -> tuple[int, list[Child]]:
    gw = free_port()
    if arm == "sglang-router-pd":
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(gw), "--pd-disaggregation"]  # fmt: skip
        for p, b in pool.prefill:
            argv += ["--prefill", f"http://127.0.0.1:{p}", str(b)]
        for p in pool.decode:
            argv += ["--decode", f"http://127.0.0.1:{p}"]
        argv += ["--prefill-policy", "cache_aware", "--decode-policy", "power_of_two",
                 "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                 "--log-level", "error"]  # fmt: skip
        child = Child("router", argv, run_dir / f"router-{arm}.log")
        child.start()
        await wait_child_port("127.0.0.1", gw, child, timeout=300)
        await asyncio.sleep(3.0)  # it registers its workers after it listens
        return gw, [child]
    path = run_dir / f"policy-{arm}.yaml"
    path.write_text(yaml.safe_dump(pd_policy(pool, gw), sort_keys=False))
    argv = [str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "-c", str(path), "--run-dir", str(run_dir / f"up-{arm}"), "--drain-timeout", "1"]  # fmt: skip
    child = Child(f"up-{arm}", argv, run_dir / f"up-{arm}.log")
    child.start()
    await wait_child_port("127.0.0.1", gw, child, timeout=400)
    await wait_child_line(child, "tokenweir up: ready", timeout=400)
    await asyncio.sleep(2.0)  # Envoy's health checks find the decode replicas
    return gw, [child]


async def _arm(arm: str, jobs: list[Job], a: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    pool = PdPool(run_dir, arm, a)
    children: list[Child] = []
    try:
        await pool.start()
        gw, children = await _gateway(arm, pool, run_dir)
        run = asyncio.ensure_future(drive(f"http://127.0.0.1:{gw}/v1/chat/completions", jobs, a))
        if a.pd_kill:  # a replica dies mid-run: every request must still end (answer or error)
            await asyncio.sleep(a.pd_kill_after)
            victim = next(c for c in pool.children if c.name.startswith(f"{a.pd_kill}0-"))
            victim.signal(signal.SIGKILL)
            res_kill = {"killed": victim.name, "at_s": a.pd_kill_after}
        res = await run
        if a.pd_kill:
            res["kill"] = res_kill
        res.pop("per_request")
        pre = await pool.sums([p for p, _ in pool.prefill])
        dec = await pool.sums(pool.decode)
        prompt = pre.get("sglang:prompt_tokens_total", 0.0)
        res["prefill_hit_ratio"] = (
            pre.get("sglang:cached_tokens_total", 0.0) / prompt if prompt else 0.0
        )
        n = dec.get("sglang:inter_token_latency_seconds_count", 0.0)
        itl = dec.get("sglang:inter_token_latency_seconds_sum", 0.0) / n if n else 0.0
        res["decode_itl_mean_ms"] = 1000 * itl
        return res
    finally:
        for c in children:
            await c.aclose(2.0)
        await pool.aclose()


async def run_pd(a: argparse.Namespace) -> dict[str, Any]:
    jobs, _ = trace_jobs(load_trace(TRACE)[a.start : a.start + a.requests], a.scale)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tw-routing-pd-", dir=a.run_dir) as tmp:
        for arm in a.pd_arms:
            print(f"arm {arm} ...", flush=True)
            r = results[arm] = await _arm(arm, jobs, a, Path(tmp))
            r = {k: (float("nan") if v is None else v) for k, v in r.items()}
            print(
                f"  ttft p50 {r['ttft_p50_ms']:.0f} p95 {r['ttft_p95_ms']:.0f} p99 "
                f"{r['ttft_p99_ms']:.0f} ms  decode ITL {r['decode_itl_mean_ms']:.1f} ms  "
                f"{r['req_per_s']:.2f} req/s  prefill hit {r['prefill_hit_ratio']:.3f}  "
                f"failed {r['failed']}",
                flush=True,
            )
    out = {"config": {k: v for k, v in vars(a).items() if k != "pd_arms"} | {"arms": a.pd_arms},
           "arms": results}  # fmt: skip
    name = "routing-pd" + (f"-{a.tag}" if a.tag else "")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out
