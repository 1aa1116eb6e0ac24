"""Cache-aware routing, side by side (issue 11): the same trace through three gateways, each in
front of its own fresh pool of SGLang emulators publishing KV events.

Arms:
- ``ring_hash``: ``tokenweir up``, ring hash on ``x-session-id`` / ``x-prefix-hash`` with bounded
  load (what main did before the picker);
- ``picker``: ``tokenweir up`` with ``routing.mode: prefix_index`` (the endpoint picker, the
  override-host load balancer, ring hash as fallback);
- ``sglang-router``: PyPI ``sglang-router`` ``--policy cache_aware`` (bench-only dependency).

Workload: a contiguous slice of ``bench/data/mooncake_conversation_every12th.jsonl`` (block ids
become text, ``backends.emulator.trace``; lengths divided by ``--scale``, caches too), sent in trace
order as streamed chat completions by ``--concurrency`` closed-loop clients (``--rate R``: open
loop, the same seeded Poisson send times for every arm). Measured per arm:
prefix-cache hit ratio (the emulators' own ``sglang:cached_tokens_total`` /
``prompt_tokens_total``), TTFT p50/p95/p99 (client side, to the first content chunk), requests/s
and output tokens/s, and load balance (max/mean of requests per replica). Also printed: the hit
ratio one infinite cache would reach on the slice (the ceiling no routing passes).

    nice -n 5 .venv/bin/python bench/routing.py --start 500 --requests 300 --scale 4

``--workload docs``: agents over shared long documents (``--docs`` documents of ``--doc-words``
words, Zipf-like popularity, a unique question each). ``--workload sessions``: generated agent
sessions growing turn by turn with tool output (``bench/routing_jobs.py``), a workload the
picker's defaults were not tuned on.

Writes ``bench/results/routing-WORKLOAD.json`` and ``docs/img/routing-WORKLOAD.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
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
from bench.peers_cpu import per_request_ms, snapshot  # noqa: E402
from bench.routing_client import MODEL, drive  # noqa: E402
from bench.routing_jobs import (  # noqa: E402
    Job,
    combined_lru_hit_ratio,
    docs_jobs,
    session_jobs,
    trace_jobs,
)
from bench.routing_lora import LORA_ARMS, run_lora  # noqa: E402
from bench.routing_pd import PD_ARMS, run_pd  # noqa: E402
from bench.routing_report import picker_metrics, plot  # noqa: E402
from bench.routing_split import read_logs, split, split_line  # noqa: E402
from runtime.children import Child, checkout, wait_child_line, wait_child_port  # noqa: E402
from runtime.ports import free_port  # noqa: E402

TRACE = ROOT / "bench" / "data" / "mooncake_conversation_every12th.jsonl"
OFFSET = 1000  # KV events on replica port + OFFSET, replay on + OFFSET + 1
# picker-chunks: the picker route as before the response's end was asked for without chunks
# (usage metered in Python: every response chunk through ext_proc)
# picker-baseline: the picker route run from another checkout's code (--baseline-src), side by side
# picker-nobacklog: the picker with routing.backlog_weight 0 (prefill backlogs ignored)
# picker-ttft: the picker with routing.scoring predicted_ttft (experimental, issue 37)
ARMS = ("ring_hash", "picker", "picker-chunks", "picker-baseline", "picker-nobacklog",
        "picker-ttft", "sglang-router")  # fmt: skip


def _kv_port_ok(p: int) -> bool:
    """``p + OFFSET`` (bound on every interface) and ``p + OFFSET + 1`` can be bound now."""
    for port, host in ((p + OFFSET, ""), (p + OFFSET + 1, "127.0.0.1")):
        if port >= 65536:
            return False
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


class Pool:
    """``replicas`` fresh emulators with KV events on."""

    def __init__(self, run_dir: Path, label: str, a: argparse.Namespace) -> None:
        self.run_dir, self.label, self.a = run_dir, label, a
        self.ports: list[int] = []
        self.children: list[Child] = []

    async def start(self) -> None:
        a = self.a
        for i in range(a.replicas):
            port = free_port()
            while not _kv_port_ok(port):
                port = free_port()
            kv = {
                "publisher": "zmq",
                "endpoint": f"tcp://*:{port + OFFSET}",
                "replay_endpoint": f"tcp://127.0.0.1:{port + OFFSET + 1}",
            }
            argv = [
                sys.executable, "-m", "backends.emulator", "--host", "127.0.0.1",
                "--port", str(port), "--model", MODEL, "--profile", a.profile,
                "--time-scale", str(a.time_scale), "--seed", str(i), "--log-level", "WARNING",
                "--cache-tokens", str(a.cache_tokens // a.scale),
                "--kv-events-config", json.dumps(kv),
                "--request-log", str(self.request_log(i)),
                *(["--tokenizer-path", a.tokenizer_path] if a.tokenizer_path else []),
            ]  # fmt: skip
            child = Child(f"emu-{self.label}-{i}", argv, self.run_dir / f"emu-{self.label}-{i}.log")
            child.start()
            if a.emulator_nice and child.pid is not None:
                # the emulators stand in for GPU servers on other hosts: niced, the CPU they
                # burn emulating a GPU is not taken from the gateway (every arm alike)
                os.setpriority(os.PRIO_PROCESS, child.pid, a.emulator_nice)
            self.children.append(child)
            self.ports.append(port)
        for port, child in zip(self.ports, self.children, strict=True):
            await wait_child_port("127.0.0.1", port, child, timeout=60)

    def request_log(self, i: int) -> Path:
        return self.run_dir / f"requests-{self.label}-{i}.jsonl"

    async def counters(self, http: aiohttp.ClientSession) -> list[dict[str, float]]:
        out = []
        for p in self.ports:
            async with http.get(f"http://127.0.0.1:{p}/metrics") as r:
                text = await r.text()
            vals: dict[str, float] = {}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name in (
                        "sglang:cached_tokens_total",
                        "sglang:prompt_tokens_total",
                        "sglang:num_requests_total",
                        "sglang:time_to_first_token_seconds_sum",
                        "sglang:time_to_first_token_seconds_count",
                    ):
                        vals[s.name] = vals.get(s.name, 0.0) + s.value
            out.append(vals)
        return out

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.children))


def tokenweir_policy(
    pool: Pool,
    gw: int,
    fp: int,
    mp: int,
    picker: bool,
    scale: int,
    a_pending: float = 5.0,
    cache_weight: float = 0.7,
    meter: str = "envoy",
    backlog_weight: float = 1.0,
    scoring: str = "weights",
) -> dict[str, Any]:
    plugins: list[Any] = [{"name": "identity", "settings": {"require": False}}, "tokens", "prefix"]
    if picker:
        plugins.append("picker")
    plugins.append("usage")
    chat: dict[str, Any] = {
        "models": [MODEL],
        "endpoints": [f"127.0.0.1:{p}" for p in pool.ports],
        "max_body_bytes": "8MiB",
        "affinity": {"headers": ["x-session-id", "x-prefix-hash"], "prefix_tokens": 256},
        "health_check": {"interval": "1s", "timeout": "1s"},
        "retries": {"enabled": False},
        "timeouts": {"connect": "1s", "request": "0s", "stream_idle": "120s"},
    }
    if picker:
        chat["routing"] = {
            "mode": "prefix_index",
            "kv_events_port_offset": OFFSET,
            # one trace block is 512 / scale tokens: count a match of one block
            "min_prefix_tokens": max(16, 512 // scale // 2),
            "checkpoint_bytes": 512,
            "pending_ttl": f"{a_pending}s",
            "cache_weight": cache_weight,
            "backlog_weight": backlog_weight,
            "scoring": scoring,
            "tokenizer": pool.a.tokenizer_path or "emulator",  # as the emulators (--tokenizer-path)
        }
    return {
        "version": 1,
        "control_plane": {
            "xds": f"127.0.0.1:{free_port()}",
            "metrics": f"127.0.0.1:{free_port()}",
            "drain_timeout": "1s",
        },
        "filters": {
            "address": f"127.0.0.1:{fp}",
            "metrics_port": mp,
            "message_timeout": "2s",
            "max_body_bytes": "8MiB",
        },
        "pools": {"chat": chat},
        "gateways": {
            "edge": {
                "listen": f"127.0.0.1:{gw}",
                "routes": [
                    {
                        "name": "chat",
                        "match": {"prefix": "/v1/"},
                        "pool": "chat",
                        "filters": {"plugins": plugins, "usage_meter": meter},
                    }
                ],
            }
        },
    }


class Gateway:
    def __init__(self, arm: str, pool: Pool, run_dir: Path) -> None:
        self.arm, self.pool, self.run_dir = arm, pool, run_dir
        self.port = free_port()
        self.children: list[Child] = []
        self.metrics_url: str | None = None

    async def start(self) -> None:
        if self.arm == "sglang-router":
            argv = [
                sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(self.port), "--worker-urls",
                *[f"http://127.0.0.1:{p}" for p in self.pool.ports],
                "--policy", "cache_aware", "--prometheus-port", str(free_port()),
                "--prometheus-host", "127.0.0.1", "--log-level", "error",
            ]  # fmt: skip
            child = self._spawn("sglang-router", argv)
            await wait_child_port("127.0.0.1", self.port, child, timeout=300)
            return
        fp, mp = free_port(), free_port()
        a = self.pool.a
        policy = tokenweir_policy(
            self.pool, self.port, fp, mp, self.arm.startswith("picker"), a.scale, a.pending_ttl,
            a.cache_weight, "python" if self.arm == "picker-chunks" else "envoy",
            0.0 if self.arm == "picker-nobacklog" else 1.0,
            "predicted_ttft" if self.arm == "picker-ttft" else "weights",
        )  # fmt: skip
        path = self.run_dir / f"policy-{self.arm}.yaml"
        path.write_text(yaml.safe_dump(policy, sort_keys=False))
        self.metrics_url = f"http://127.0.0.1:{mp}/metrics"
        argv = [
            str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "-c", str(path), "--run-dir", str(self.run_dir / f"up-{self.arm}"),
            "--drain-timeout", "1",
            *(["--replicas", a.up_replicas] if a.up_replicas else []),
        ]  # fmt: skip
        child = self._spawn(f"up-{self.arm}", argv)
        # (a shared 2-core box at load 11-13 took over two minutes to start a mesh)
        await wait_child_port("127.0.0.1", self.port, child, timeout=300)
        await wait_child_line(child, "tokenweir up: ready", timeout=300)

    def _spawn(self, name: str, argv: list[str]) -> Child:
        src = self.pool.a.baseline_src if self.arm == "picker-baseline" else None
        if self.arm == "picker-baseline" and src is None:
            raise ValueError("the picker-baseline arm needs --baseline-src")
        env, cwd = checkout(Path(src) if src is not None else None)
        child = Child(name, argv, self.run_dir / f"{name}.log", env=env, cwd=cwd)
        child.start()
        self.children.append(child)
        return child

    async def aclose(self) -> None:
        for c in reversed(self.children):
            await c.aclose(2.0)


async def run_arm(
    arm: str, records: list[Job], a: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    pool = Pool(run_dir, arm, a)
    gw = Gateway(arm, pool, run_dir)
    try:
        await pool.start()
        await gw.start()
        await asyncio.sleep(2.0)  # the picker's subscribers connect and resync
        url = f"http://127.0.0.1:{gw.port}/v1/chat/completions"
        roots = [p for p in (c.pid for c in gw.children) if p is not None]
        cpu0 = snapshot(roots)
        res = await drive(url, records, a)
        # the gateway's CPU per request, per process kind (Envoy, filters, control plane...)
        res["gateway_cpu_ms_per_request"] = per_request_ms(cpu0, snapshot(roots), res["requests"])
        async with aiohttp.ClientSession() as http:
            counts = await pool.counters(http)
            if gw.metrics_url:
                async with http.get(gw.metrics_url) as r:
                    res["gateway_metrics"] = picker_metrics(await r.text())
        prompt = sum(c.get("sglang:prompt_tokens_total", 0) for c in counts)
        cached = sum(c.get("sglang:cached_tokens_total", 0) for c in counts)
        reqs = [c.get("sglang:num_requests_total", 0) for c in counts]
        res["hit_ratio"] = cached / prompt if prompt else 0.0
        # the backends' own TTFT (arrival at the replica → first token): what is left of the
        # client's TTFT is the gateway's share (its queueing and CPU, and the hops)
        t_sum = sum(c.get("sglang:time_to_first_token_seconds_sum", 0) for c in counts)
        t_n = sum(c.get("sglang:time_to_first_token_seconds_count", 0) for c in counts)
        res["backend_ttft_mean_ms"] = 1000 * t_sum / t_n if t_n else None
        # per request: the backend's share of the client's TTFT and the rest (the gateway's)
        logs = read_logs(pool.request_log(i) for i in range(a.replicas))
        res["ttft_split"] = split(res.pop("per_request"), logs)
        rows = res["ttft_split"].pop("rows", [])
        tag = f"{a.workload}-{a.tag}" if a.tag else a.workload
        (run_dir / f"rows-{tag}-{arm}.json").write_text(json.dumps(rows))
        res["per_replica_requests"] = reqs
        res["max_over_mean"] = max(reqs) / (sum(reqs) / len(reqs)) if sum(reqs) else 0.0
        return res
    finally:
        await gw.aclose()
        await pool.aclose()


async def main_async(a: argparse.Namespace) -> int:
    if a.workload == "trace":
        jobs, ceiling = trace_jobs(load_trace(TRACE)[a.start : a.start + a.requests], a.scale)
    elif a.workload == "sessions":
        jobs, ceiling = session_jobs(a.requests, a.sessions, seed=a.start)
    else:
        jobs, ceiling = docs_jobs(a.requests, a.docs, a.doc_words, seed=a.start)
    lru = combined_lru_hit_ratio(jobs, a.replicas * (a.cache_tokens // a.scale))
    print(f"infinite-cache ceiling {ceiling:.3f}, one LRU cache of the pool's size {lru:.3f}")
    results: dict[str, dict[str, Any]] = {}
    keep = a.run_dir is not None  # logs kept there for a post-mortem
    tmp_dir = (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="tw-routing-", dir=a.run_dir))
        if keep
        else tempfile.TemporaryDirectory(prefix="tw-routing-")
    )
    with tmp_dir as tmp:
        for arm in a.arms:
            print(f"arm {arm} ...", flush=True)
            results[arm] = await run_arm(arm, jobs, a, Path(tmp))
            r = results[arm]
            print(
                f"  hit {r['hit_ratio']:.3f}  ttft p50 {r['ttft_p50_ms']:.0f} p95 {r['ttft_p95_ms']:.0f}"
                f" p99 {r['ttft_p99_ms']:.0f} ms (after the first wave p95"
                f" {r['ttft_p95_after_first_wave_ms']:.0f} p99 {r['ttft_p99_after_first_wave_ms']:.0f})"
                f"  mean {r['ttft_mean_ms']:.0f} ms"
                f" (backends' own {r['backend_ttft_mean_ms'] or 0:.0f})  {r['req_per_s']:.2f} req/s"
                f" {r['out_tok_per_s']:.0f} tok/s  max/mean {r['max_over_mean']:.2f}"
                f"  failed {r['failed']}  per replica {r['per_replica_requests']}"
                f"  gateway CPU ms/request {r['gateway_cpu_ms_per_request']}",
                flush=True,
            )
            print(f"  TTFT split {split_line(r['ttft_split'])}", flush=True)
    out = {
        "config": vars(a),
        "infinite_cache_hit_ratio": ceiling,
        "combined_lru_hit_ratio": lru,
        "arms": results,
    }
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    name = f"routing-{a.workload}" + (f"-{a.tag}" if a.tag else "")
    (ROOT / "bench" / "results" / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(results, ROOT / "docs" / "img" / f"{name}.png")
    print(f"infinite-cache ceiling on this slice: {ceiling:.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--workload", choices=("trace", "docs", "sessions", "pd", "lora"), default="trace"
    )
    ap.add_argument("--sessions", type=int, default=60, help="sessions workload: sessions")
    ap.add_argument("--docs", type=int, default=24, help="docs workload: documents")
    ap.add_argument("--doc-words", type=int, default=3000, help="docs workload: words each")
    ap.add_argument("--start", type=int, default=500, help="trace: first record; docs: seed")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--rate", type=float, default=None,
        help="open loop: send at this many requests/s (seeded Poisson, the same for every arm) "
        "instead of --concurrency closed-loop clients",
    )  # fmt: skip
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument(
        "--emulator-nice",
        type=int,
        default=0,
        help="run the emulators at this nice value (every arm alike): on a small box the CPU "
        "they burn emulating GPUs otherwise queues the gateway's processes behind them",
    )
    ap.add_argument("--cache-tokens", type=int, default=460_000)
    ap.add_argument("--pending-ttl", type=float, default=1.0, help="picker: routing.pending_ttl")
    ap.add_argument("--cache-weight", type=float, default=0.7, help="picker: routing.cache_weight")
    ap.add_argument("--run-dir", help="keep the run's logs in a new folder under this one")
    ap.add_argument(
        "--arms",
        nargs="+",
        default=[
            x for x in ARMS if x not in ("picker-baseline", "picker-nobacklog", "picker-ttft")
        ],
        choices=ARMS,
    )
    ap.add_argument(
        "--up-replicas",
        help="tokenweir arms: `tokenweir up --replicas` (e.g. gateway=2,filters=2: Envoys and "
        "filter servers sharing their ports), for a machine with cores to spare",
    )
    ap.add_argument("--tokenizer-path", help="a model directory: emulators and picker use it")
    ap.add_argument("--tag", help="results as routing-WORKLOAD-TAG.{json,png}")
    ap.add_argument("--baseline-src", help="a checkout whose code the picker-baseline arm runs")
    ap.add_argument("--prefill", type=int, default=2, help="pd workload: prefill servers")
    ap.add_argument("--decode", type=int, default=2, help="pd workload: decode servers")
    ap.add_argument("--pd-arms", nargs="+", default=list(PD_ARMS), choices=PD_ARMS)
    ap.add_argument("--pd-kill", choices=("prefill", "decode"), help="pd: kill one mid-run")
    ap.add_argument("--pd-kill-after", type=float, default=2.0, help="pd: seconds into the run")
    lo = ap.add_argument_group("lora workload (bench/routing_lora.py)")
    lo.add_argument("--adapters", type=int, default=20)
    lo.add_argument("--zipf-s", type=float, default=1.0, help="adapter popularity exponent")
    lo.add_argument("--lora-slots", type=int, default=4, help="--max-loras-per-batch")
    lo.add_argument("--lora-load-ms", type=float, default=30.0, help="a slot load's cost")
    lo.add_argument("--lora-arms", nargs="+", default=list(LORA_ARMS), choices=LORA_ARMS)
    a = ap.parse_args()
    if a.workload == "lora":
        a.rate = a.rate or 12.0
        asyncio.run(run_lora(a))
        return 0
    if a.workload == "pd":  # the PD arms (bench/routing_pd.py): trace, PD emulators
        asyncio.run(run_pd(a))
        return 0
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    sys.exit(main())
