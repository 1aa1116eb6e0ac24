"""Batch jobs in the valleys (issue 41): a day-shaped interactive trace, time-scaled, with a batch
submitted at its start; three arms side by side on one `tokenweir up` mesh and the same seeded
arrivals:

- ``alone``: the interactive trace only (its TTFT is the reference);
- ``runner``: the trace + a batch job through the Batch API (the runner paces itself);
- ``naive``: the trace + the same lines sent by a client at batch priority (``x-lane: batch``)
  as fast as the gateway allows (``--naive-concurrency`` in flight, Retry-After honoured).

Capacity is counted in running slots (the pool's ``max_running_requests``): every
``--sample`` seconds the interactive requests in flight (client side) and the batch lines in
flight (the runner's gauge, the naive client's count) are read; the idle capacity is
``slots - interactive``, the batch's use of it ``min(batch, idle)``. The filter server's
degradation step (``tokenweir_filters_ladder_step``) is sampled with them: the example clamps
the free tier's answers from step 1 (``ladder_step_share``, ``ladder_steps_up``).

    python bench/batch_valleys.py --day 40 --out bench/results/batch_valleys.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from batch_mesh import KEY, MODEL, example_on_free_ports, gauge, lines, start_up, stop_up  # noqa: E402

from runtime.ports import free_port  # noqa: E402


def policy_text(
    slots_profile: str,
    fill: float | None,
    time_scale: float = 1.0,
    step_increase: str | None = None,
    slots: int | None = None,
) -> tuple[str, int, dict[str, int]]:
    """The example policy on free ports: one chat replica, no sidecar, the batch runner."""
    doc, ports = example_on_free_ports()
    ports["em"] = free_port()
    chat = doc["pools"]["chat"]["emulated"]
    chat.update(replicas=1, profile=slots_profile, base_port=ports["em"], time_scale=time_scale)
    if slots is not None:  # the replica runs this many (SGLang's --max-running-requests)
        doc["pools"]["chat"].setdefault("capacity", {})["max_running_requests"] = slots
    if fill is not None:
        doc["batch"]["runner"]["fill"] = fill
    if step_increase is not None:  # the step guard's key; "off": null (no guard)
        off = step_increase == "off"
        doc["batch"]["runner"]["max_step_increase"] = None if off else float(step_increase)
    # the bench's tenant is not the bottleneck: pro's token bucket is large
    return yaml.safe_dump(doc, sort_keys=False), ports["gw"], ports


def day_arrivals(day_s: float, peak_rps: float, valley_rps: float, seed: int) -> list[float]:
    """Open-loop arrival offsets whose rate follows one day: a night valley, a midday peak."""
    rng = random.Random(seed)
    out, t = [], 0.0
    top = peak_rps
    while t < day_s:
        t += rng.expovariate(top)
        rate = valley_rps + (peak_rps - valley_rps) * math.sin(math.pi * t / day_s) ** 2
        if rng.random() < rate / top:  # thinning
            out.append(t)
    return [x for x in out if x < day_s]


@dataclass
class Arm:
    name: str
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    inter: int = 0  # interactive in flight now
    batch: int = 0  # naive lines in flight now
    batch_done: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (interactive, batch)
    # the replica's own view at the same instants: (interactive running, batch running,
    # interactive waiting, batch waiting), by the priority each lane carries
    replica: list[tuple[int, int, int, int]] = field(default_factory=list)
    preempted: int = 0  # batch requests preempted by the replica during the arm
    # per interactive request with a first token: (ttft, batch running at the replica at its
    # arrival (the last sample), interactive requests in flight at its arrival)
    seen: list[tuple[float, int, int]] = field(default_factory=list)
    guard: list[int] = field(default_factory=list)  # the runner's step-guard cap, when binding
    # the pool's degradation step at each sample (the filter server's gauge): at 1 the example
    # clamps the free tier's answers, at 2 it sends them to the fallback model
    ladder: list[int] = field(default_factory=list)


async def interactive(http: aiohttp.ClientSession, url: str, arm: Arm, i: int, tokens: int) -> None:
    body = {
        "model": MODEL, "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": f"question {i}: " + "word " * 40}],
    }  # fmt: skip
    at_batch = arm.replica[-1][1] if arm.replica else 0
    at_inter = arm.inter
    arm.inter += 1
    start = time.monotonic()
    first = None
    try:
        headers = {"authorization": f"Bearer {KEY}", "x-lane": "interactive"}
        async with http.post(url, json=body, headers=headers) as r:
            if r.status != 200:
                arm.errors += 1
                await r.read()
                return
            async for chunk in r.content.iter_any():
                if first is None and b"content" in chunk:
                    first = time.monotonic() - start
        if first is not None:
            arm.ttft.append(first)
            arm.seen.append((first, at_batch, at_inter))
    except (aiohttp.ClientError, TimeoutError):
        arm.errors += 1
    finally:
        arm.inter -= 1


async def naive(
    http: aiohttp.ClientSession, url: str, arm: Arm, todo: list[dict[str, Any]], stop: asyncio.Event
) -> None:
    headers = {"authorization": f"Bearer {KEY}", "x-lane": "batch"}
    while todo and not stop.is_set():
        line = todo.pop()
        arm.batch += 1
        try:
            async with http.post(url, json=line["body"], headers=headers) as r:
                await r.read()
                if r.status == 200:
                    arm.batch_done += 1
                    continue
                todo.append(line)
                wait = float(r.headers.get("retry-after", "0.05") or 0.05)
        except (aiohttp.ClientError, TimeoutError):
            todo.append(line)
            wait = 0.05
        finally:
            arm.batch -= 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


INTERACTIVE_PRIORITY, BATCH_PRIORITY = "100", "0"  # policy/admission.py's defaults
LADDER_STEP = 'tokenweir_filters_ladder_step\\{pool="chat"\\}'
LADDER_UP = 'tokenweir_filters_ladder_changes_total\\{direction="up",pool="chat"\\}'


async def replica_state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        doc: dict[str, Any] = await r.json()
    return doc


async def run_arm(
    name: str, gw: int, ports: dict[str, int], arrivals: list[float], ns: argparse.Namespace
) -> tuple[Arm, dict[str, Any]]:
    arm = Arm(name)
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    runner_metrics = f"http://127.0.0.1:{ports['runner']}/metrics"
    filter_metrics = f"http://127.0.0.1:{ports['fsm']}/metrics"
    extra: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        stop = asyncio.Event()
        workers: list[asyncio.Task[None]] = []
        batch_id = None
        if name == "runner":
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key=KEY, max_retries=2)
            data = "\n".join(json.dumps(x) for x in lines(ns.lines, ns.batch_tokens)).encode()
            f = await client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch")
            b = await client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            batch_id = b.id
        elif name == "naive":
            todo = lines(ns.lines, ns.batch_tokens)
            workers = [
                asyncio.create_task(naive(http, url, arm, todo, stop))
                for _ in range(ns.naive_concurrency)
            ]
        start = time.monotonic()
        tasks: list[asyncio.Task[None]] = []

        state_url = f"http://127.0.0.1:{ports['em']}/_emulator/state"
        first = await replica_state(http, state_url)
        steps_up = await gauge(http, filter_metrics, LADDER_UP)

        async def sampler() -> None:
            while not stop.is_set():
                b = arm.batch
                if name == "runner":
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        b = int(await gauge(http, runner_metrics, "tokenweir_batch_inflight"))
                        cap = await gauge(http, runner_metrics, "tokenweir_batch_guard_streams")
                        if cap >= 0:
                            arm.guard.append(int(cap))
                arm.samples.append((arm.inter, b))
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    arm.ladder.append(int(await gauge(http, filter_metrics, LADDER_STEP)))
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    st = await replica_state(http, state_url)
                    run, wait = st["running"], st["waiting"]
                    arm.replica.append((
                        run.get(INTERACTIVE_PRIORITY, 0), run.get(BATCH_PRIORITY, 0),
                        wait.get(INTERACTIVE_PRIORITY, 0), wait.get(BATCH_PRIORITY, 0),
                    ))  # fmt: skip
                await asyncio.sleep(ns.sample)

        samp = asyncio.create_task(sampler())
        for i, at in enumerate(arrivals):
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(interactive(http, url, arm, i, ns.inter_tokens)))
        await asyncio.sleep(max(0.0, start + ns.day - time.monotonic()))
        await asyncio.gather(*tasks)
        stop.set()
        await samp
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        last = await replica_state(http, state_url)
        arm.preempted = int(last["preempted_total"]) - int(first["preempted_total"])
        extra["ladder_steps_up"] = await gauge(http, filter_metrics, LADDER_UP) - steps_up
        if batch_id is not None:
            b = await client.batches.retrieve(batch_id)
            extra["batch_completed_during_day"] = (
                b.request_counts.completed if b.request_counts else 0
            )
            await client.batches.cancel(batch_id)
            for _ in range(120):
                b = await client.batches.retrieve(batch_id)
                if b.status == "cancelled":
                    break
                await asyncio.sleep(0.5)
            arm.batch_done = b.request_counts.completed if b.request_counts else 0
            extra["shed"] = await gauge(
                http, runner_metrics, 'tokenweir_batch_lines_total\\{outcome="shed"\\}'
            )
    extra["load_avg_1m_at_end"] = float(Path("/proc/loadavg").read_text().split()[0])
    await asyncio.sleep(ns.settle)  # what the arm left running drains before the next
    return arm, extra


def summary(arm: Arm, slots: int, extra: dict[str, Any]) -> dict[str, Any]:
    idle = sum(max(0, slots - i) for i, _ in arm.samples)
    used = sum(min(b, max(0, slots - i)) for i, b in arm.samples)
    q = statistics.quantiles(arm.ttft, n=20) if len(arm.ttft) >= 20 else [float("nan")] * 19
    # the replica's view: idle = slots no interactive request runs in; used = batch running
    r_idle = sum(max(0, slots - ir) for ir, _, _, _ in arm.replica)
    r_used = sum(min(br, max(0, slots - ir)) for ir, br, _, _ in arm.replica)
    n = max(1, len(arm.replica))
    return {
        "arm": arm.name,
        "interactive_requests": len(arm.ttft),
        "interactive_errors": arm.errors,
        "ttft_p50_s": round(statistics.median(arm.ttft), 4) if arm.ttft else None,
        "ttft_p95_s": round(q[18], 4),
        "batch_lines_completed": arm.batch_done,
        "idle_slot_share_used_by_batch": round(used / idle, 3) if idle else None,
        "mean_interactive_in_flight": round(statistics.mean(i for i, _ in arm.samples), 2),
        "mean_batch_in_flight": round(statistics.mean(b for _, b in arm.samples), 2),
        "idle_slot_share_running_batch": round(r_used / r_idle, 3) if r_idle else None,
        "replica_mean_interactive_running": round(sum(x[0] for x in arm.replica) / n, 2),
        "replica_mean_batch_running": round(sum(x[1] for x in arm.replica) / n, 2),
        "replica_mean_interactive_waiting": round(sum(x[2] for x in arm.replica) / n, 3),
        "replica_mean_batch_waiting": round(sum(x[3] for x in arm.replica) / n, 2),
        "batch_preempted": arm.preempted,
        # where the tail comes from: the slowest twentieth, with the batch running at the
        # replica when each arrived, and the TTFT p95 of arrivals beside little or much batch
        "slowest": [
            {"ttft_ms": round(t * 1000, 1), "batch_running_at_arrival": b, "interactive": i}
            for t, b, i in sorted(arm.seen, reverse=True)[: max(1, len(arm.seen) // 20)]
        ],
        "arrivals_beside_batch_over_10": sum(1 for _, b, _ in arm.seen if b > 10),
        "guard_binding_share": round(len(arm.guard) / len(arm.samples), 3) if arm.samples else 0,
        "guard_mean_cap": round(statistics.mean(arm.guard), 2) if arm.guard else None,
        # the share of the day the example's ladder clamped the free tier (step 1 and up)
        "ladder_step_share": (
            round(sum(1 for x in arm.ladder if x >= 1) / len(arm.ladder), 3) if arm.ladder else None
        ),
        **extra,
    }


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    text, gw, ports = policy_text(
        ns.profile, ns.fill, ns.time_scale, ns.max_step_increase, ns.slots
    )
    up = start_up(Path(ns.run_dir), text)
    try:
        slots = ns.slots
        arrivals = day_arrivals(ns.day, ns.peak_rps, ns.valley_rps, ns.seed)
        rows = []
        for name in ns.arms:
            arm, extra = await run_arm(name, gw, ports, arrivals, ns)
            rows.append(summary(arm, slots, extra))
            print(json.dumps(rows[-1]), flush=True)
        base = rows[0]["ttft_p95_s"]
        for r in rows:
            r["ttft_p95_vs_alone"] = round(r["ttft_p95_s"] / base, 3) if base else None
        return {
            "setup": {k: v for k, v in vars(ns).items() if k not in ("out",)},
            "arrivals": len(arrivals),
            "rows": rows,
        }
    finally:
        stop_up(up)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--day", type=float, default=40.0, help="seconds one day lasts")
    p.add_argument("--peak-rps", type=float, default=4.0)
    p.add_argument("--valley-rps", type=float, default=0.3)
    p.add_argument("--inter-tokens", type=int, default=64)
    p.add_argument("--batch-tokens", type=int, default=64)
    p.add_argument("--lines", type=int, default=10000)
    p.add_argument("--profile", default="seed-2k")
    p.add_argument(
        "--slots",
        type=int,
        default=64,
        help="the pool's running slots (capacity.max_running_requests: the replica runs that many)",
    )
    p.add_argument("--fill", type=float, help="the runner's fill (default: the example's)")
    p.add_argument(
        "--max-step-increase",
        help="batch.runner.max_step_increase (a share, or 'off'; default: the example's)",
    )
    p.add_argument("--naive-concurrency", type=int, default=128)
    p.add_argument("--sample", type=float, default=0.25)
    p.add_argument("--settle", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the emulator's time scale; the day and the request rates are scaled with it (the "
        "same slot occupancy with N times fewer requests a second: less gateway CPU per slot)",
    )
    p.add_argument("--arms", nargs="+", default=["alone", "runner", "naive"])
    p.add_argument("--run-dir", default="/tmp/tokenweir-batch-valleys")
    p.add_argument("--out", type=Path)
    ns = p.parse_args()
    ns.day *= ns.time_scale
    ns.peak_rps /= ns.time_scale
    ns.valley_rps /= ns.time_scale
    result = asyncio.run(main_async(ns))
    text = json.dumps(result, indent=2)
    print(text)
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
