"""Validation of the capacity planner against the emulated pool (issue 6).

Plans a pool of seed-2k replicas (the seed's GPU: 2,000 tok/s at a 20 ms TBT → 40 slots), starts
the planned number of emulators (``python -m backends.emulator``) with ``--max-running-requests``
set to the planned slots, and drives them with an open-loop Poisson load at 0.5x, 0.8x, 1.0x and
1.2x the planned load (plus 1.4x as a stress point). Each arrival goes to a replica chosen at
random, which splits a Poisson stream into Poisson streams (the per-replica model's assumption).

Measured per level: mean concurrency per replica (the emulator's ``num_running_reqs`` +
``num_queue_reqs``, sampled every 0.2 s), queue wait (the emulator's ``queue_time_seconds``
histogram: exact mean, p95 interpolated in its buckets), TTFT p95 (client-side, streamed).
Predicted: the same numbers from M/M/c (Erlang C), M/G/c (Allen–Cunneen) and the batch-aware
chain. Results go to bench/results/capacity_validate_TAG.json, a table between markers in
docs/capacity.md, and docs/img/capacity_validation_TAG.png.

Run: .venv/bin/python bench/capacity_validate.py                          (planned pool, ~4 min)
     .venv/bin/python bench/capacity_validate.py --replicas 2 --tag mmc-sized   (what M/M/c plans)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backends.profiles import get_profile  # noqa: E402
from controlplane.planner.capacity import MODELS, replica_capacity, wait_estimate  # noqa: E402
from controlplane.planner.inputs import PlanInputs, TokenDist, TrafficClass  # noqa: E402
from controlplane.planner.plan import make_plan  # noqa: E402
from controlplane.planner.replica import for_workload  # noqa: E402
from tests.helpers import ChildProcess, free_port, wait_for_port  # noqa: E402

MULTIPLIERS = (0.5, 0.8, 1.0, 1.2, 1.4)
_METRIC = re.compile(
    r'^(sglang:[a-z_]+?)(?:_bucket)?\{(?:le="([^"]+)",)?model_name="[^"]*"\} (\S+)$'
)


Totals = dict[str, tuple[dict[str, float], float, float]]


@dataclass
class Level:
    multiplier: float
    qps: float
    sent: int = 0
    errors: int = 0
    ttfts: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)  # per-replica samples
    queued: list[float] = field(default_factory=list)
    hists: Totals = field(default_factory=dict)  # name → (le → count, sum, count), deltas
    cpu_cores: float = 0.0  # CPU cores used by the emulators and this driver
    loadavg: float = 0.0  # the machine's 1-minute load average at the end (others share it)


def output_lengths(rng: random.Random, n: int, mean: float, cap: int) -> list[int]:
    """Geometric-like output lengths (SCV ≈ 1), at least 1 and at most ``cap``."""
    return [min(cap, 1 + int(rng.expovariate(1.0 / (mean - 1)))) for _ in range(n)]


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, float]]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2) or ""] = float(m.group(3))
    return out


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int, lv: Level,
    record: bool,
) -> None:  # fmt: skip
    body = {"model": "emulated-model", "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                lv.errors += 1
                await resp.read()
                return
            first = None
            async for line in resp.content:
                if line.startswith(b"data:"):
                    first = time.perf_counter()
                    break
            async for _ in resp.content.iter_chunked(65536):
                pass
    except aiohttp.ClientError:
        lv.errors += 1
        return
    if record and first is not None:
        lv.ttfts.append(first - t0)


async def sampler(
    session: aiohttp.ClientSession, urls: list[str], lv: Level, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        for url in urls:
            m = await scrape(session, url)
            lv.running.append(m.get("sglang:num_running_reqs", {}).get("", math.nan))
            lv.queued.append(m.get("sglang:num_queue_reqs", {}).get("", math.nan))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


_HISTS = ("sglang:queue_time_seconds", "sglang:time_to_first_token_seconds")


async def hist_totals(session: aiohttp.ClientSession, urls: list[str]) -> Totals:
    """Buckets, sum and count of the queue-time and TTFT histograms, summed over replicas."""
    out: Totals = {}
    for url in urls:
        m = await scrape(session, url)
        for name in _HISTS:
            hist, s, c = out.get(name, ({}, 0.0, 0.0))
            for le, v in m.get(name, {}).items():
                hist[le] = hist.get(le, 0.0) + v
            s += m.get(f"{name}_sum", {}).get("", 0.0)
            c += m.get(f"{name}_count", {}).get("", 0.0)
            out[name] = (hist, s, c)
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def run_level(
    urls: list[str], lv: Level, warmup: float, measure: float, rng: random.Random,
    prompt_len: int, out_mean: float, out_cap: int, pids: list[int],
) -> None:  # fmt: skip
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        t_measure, t_end = start + warmup, start + warmup + measure
        stop = asyncio.Event()
        sampling: asyncio.Task[None] | None = None
        before: Totals | None = None
        cpu0 = 0.0
        next_at = start
        while True:
            next_at += rng.expovariate(lv.qps)
            now = time.perf_counter()
            if sampling is None and now >= t_measure:
                before = await hist_totals(session, urls)
                cpu0 = cpu_seconds(pids)
                sampling = asyncio.create_task(sampler(session, urls, lv, stop))
            if next_at >= t_end:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            url = urls[rng.randrange(len(urls))]
            prompt = [rng.randrange(1, 2**31) for _ in range(prompt_len)]
            length = output_lengths(rng, 1, out_mean, out_cap)[0]
            record = next_at >= t_measure
            lv.sent += record
            task = asyncio.create_task(one_request(session, url, prompt, length, lv, record))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        stop.set()
        if sampling is not None:
            await sampling
        after = await hist_totals(session, urls)
        lv.cpu_cores = (cpu_seconds(pids) - cpu0) / measure
        lv.loadavg = os.getloadavg()[0]
        if before is not None:
            for name, (hist, total, count) in after.items():
                h0, t0, c0 = before[name]
                delta = {k: hist.get(k, 0) - h0.get(k, 0) for k in hist}
                lv.hists[name] = (delta, total - t0, count - c0)
        if tasks:  # let in-flight requests finish so the next level starts clean-ish
            await asyncio.wait(tasks, timeout=60)


def hist_quantile(hist: dict[str, float], q: float) -> float:
    """Quantile from cumulative Prometheus buckets, linear inside the bucket."""
    edges = sorted((float(k), v) for k, v in hist.items() if k not in ("", "+Inf"))
    total = hist.get("+Inf", edges[-1][1] if edges else 0.0)
    if total <= 0:
        return math.nan
    target, lo_edge, lo_count = q * total, 0.0, 0.0
    for edge, count in edges:
        if count >= target:
            if count == lo_count:
                return edge
            return lo_edge + (edge - lo_edge) * (target - lo_count) / (count - lo_count)
        lo_edge, lo_count = edge, count
    return math.inf


def wait_for_quiet(threshold: float, limit_s: float) -> None:
    """Timings on a shared 2-core machine mean little while others load it: wait a while."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] > threshold and time.monotonic() < deadline:
        time.sleep(5)


def hist_mean(h: tuple[dict[str, float], float, float]) -> float:
    return h[1] / h[2] if h[2] else math.nan


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", default="seed-2k")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-mean", type=float, default=100.0)
    ap.add_argument("--output-cap", type=int, default=800)
    ap.add_argument("--ttft", type=float, default=0.25)
    ap.add_argument("--tbt", type=float, default=0.020)
    ap.add_argument("--qps", type=float, default=24.0)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--measure", type=float, default=30.0)
    ap.add_argument("--multipliers", default=",".join(str(m) for m in MULTIPLIERS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, help="run this many replicas instead of the plan's")
    ap.add_argument("--tag", default="planned", help="names the docs section, JSON and PNG")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/capacity.md")
    ap.add_argument(
        "--quiet-load",
        type=float,
        default=3.0,
        help="before each level wait (up to 3 min) until the 1-min load average is below this",
    )
    args = ap.parse_args()

    rng = random.Random(args.seed)
    outs = output_lengths(random.Random(args.seed + 1), 50_000, args.output_mean, args.output_cap)
    output = TokenDist.from_samples(outs, "output_tokens")
    # a profile with context terms is planned at this workload's mean context (no prefix hits)
    replica, context_note = for_workload(
        get_profile(args.profile), args.prompt_tokens, output.mean, 0.0
    )
    inputs = PlanInputs(
        replica=replica,
        prompt=TokenDist(args.prompt_tokens, args.prompt_tokens, 0.0, "prompt_tokens"),
        output=output,
        context_note=context_note,
        ttft_s=args.ttft,
        tbt_s=args.tbt,
        classes=(TrafficClass("chat", args.qps),),
        profile_name=args.profile,
    )
    plan = make_plan(inputs)
    cap = replica_capacity(inputs)
    n = args.replicas or plan.replicas
    print(
        f"plan: {plan.replicas} replicas × {cap.c} slots (running {n}), S = {cap.service_s:.4g} s,"
        f" τ = {cap.tau_s:.4g} s, ρ = {plan.utilization:.3g}"
    )

    logs = REPO / "bench" / "results"
    logs.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="tw-capacity-")
    children, urls = [], []
    try:
        for i in range(n):
            port = free_port()
            argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--profile",
                    args.profile, "--max-running-requests", str(cap.c), "--seed", str(i),
                    "--log-level", "WARNING"]  # fmt: skip
            children.append(ChildProcess(argv, log=Path(tmp.name) / f"emulator_{i}.log"))
            wait_for_port(port, timeout=30)
            urls.append(f"http://127.0.0.1:{port}")
        pids = [c.proc.pid for c in children] + [os.getpid()]
        levels = []
        for m in (float(x) for x in args.multipliers.split(",")):
            wait_for_quiet(args.quiet_load, 180.0)
            lv = Level(m, m * args.qps)
            asyncio.run(
                run_level(
                    urls,
                    lv,
                    args.warmup,
                    args.measure,
                    rng,
                    args.prompt_tokens,
                    args.output_mean,
                    args.output_cap,
                    pids,
                )
            )
            levels.append(lv)
            print(f"  {m:g}x: {lv.sent} sent, {lv.errors} errors, running {mean(lv.running):.3g}, "
                  f"queued {mean(lv.queued):.3g}, TTFT p95 {quantile(lv.ttfts, 0.95) * 1e3:.4g} ms")  # fmt: skip
    finally:
        for child in children:
            child.close()
        tmp.cleanup()

    rows = []
    for lv in levels:
        lam_r = lv.sent / args.measure / n  # predict at the rate actually offered
        pred = {mdl: wait_estimate(inputs, cap, lam_r, mdl) for mdl in MODELS}
        rows.append({
            "multiplier": lv.multiplier, "qps": lv.qps, "utilization": lam_r * cap.tau_s,
            "sent": lv.sent, "errors": lv.errors, "measured_qps": lv.sent / args.measure,
            "cpu_cores": lv.cpu_cores, "loadavg": lv.loadavg,
            "measured": {
                "concurrency": mean(lv.running) + mean(lv.queued),
                "running": mean(lv.running), "queued": mean(lv.queued),
                "queue_wait_mean_s": hist_mean(lv.hists[_HISTS[0]]),
                "queue_wait_p95_s": hist_quantile(lv.hists[_HISTS[0]][0], 0.95),
                "server_ttft_p95_s": hist_quantile(lv.hists[_HISTS[1]][0], 0.95),
                "server_ttft_mean_s": hist_mean(lv.hists[_HISTS[1]]),
                "ttft_p95_s": quantile(lv.ttfts, 0.95),
                "ttft_p50_s": quantile(lv.ttfts, 0.50),
            },
            "predicted": {
                mdl: {"concurrency": w.mean_concurrency, "p_wait": w.p_wait,
                      "queue_wait_mean_s": w.mean_s, "queue_wait_p95_s": w.quantile_s,
                      "ttft_p95_s": cap.ttft_floor_s + w.quantile_s}
                for mdl, w in pred.items()
            },
        })  # fmt: skip
    result = {
        "plan": {"replicas": n, "planned_replicas": plan.replicas, "tag": args.tag,
                 "mmc_replicas": make_plan(inputs, "mmc").replicas, "slots": cap.c,
                 "tau_s": cap.tau_s, "service_s": cap.service_s,
                 "ttft_floor_s": cap.ttft_floor_s, "utilization": plan.utilization,
                 "cs2": cap.cs2, "qps": args.qps, "profile": args.profile,
                 "output_mean": inputs.output.mean, "output_p95": inputs.output.p95,
                 "prompt_tokens": args.prompt_tokens},
        "rows": rows,
    }  # fmt: skip
    (logs / f"capacity_validate_{args.tag}.json").write_text(json.dumps(result, indent=2))
    from capacity_report import render_markdown, render_plot, update_docs

    md = render_markdown(result)
    print(md)
    render_plot(result, REPO / "docs" / "img" / f"capacity_validation_{args.tag}.png")
    if not args.no_docs:
        update_docs(REPO / "docs" / "capacity.md", md, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
