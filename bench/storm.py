"""Retry storm against the degradation ladder (issue 38): does the storm converge?

A pool of emulated replicas at reduced capacity behind ``tokenweir up`` with a shed step on the
batch lane (``pools.chat.degradation``, as in ``examples/mesh.yaml``). Steady traffic at
``--base`` x capacity (30% interactive: the interactive probe, 70% batch: the fresh batch that
must be served after the spike), and a storm of ``--clients`` batch requests in
``--spike-seconds``. Run twice per arm: clients that honour ``Retry-After`` (polite) and clients
that retry at once (naive); polite clients both exactly as told (the herd case) and
with 0..25% jitter. Arms side by side in one run, each on its own fresh pool:
``main`` (another checkout's code, ``--baseline-src``: ``git archive main``) and ``branch``
(this checkout), on the same policy and arrivals.

    git archive main | tar -x -C /tmp/tw-main
    .venv/bin/python bench/storm.py --baseline-src /tmp/tw-main   # about 4 minutes here
    .venv/bin/python bench/storm.py --smoke                      # this checkout only, seconds

Reported per arm and behaviour: attempts per success of the storm's requests (and how many
gave up), the goodput (streamed tokens per second) before the spike and after it, the seconds
after the spike's end until goodput is back to its pre-spike level (``recovered_s``), the share
of fresh batch requests arriving after the spike that were served (and on their first
attempt), interactive TTFT p95 and success before, during and after the spike, and the ladder's
step over time (its changes counted). Writes ``bench/results/storm.json`` and ``.md``
(``--out``). docs/benchmarks.md ("Retry storms converge") explains it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from overload_arms import POLICY, EmulatorPool, PoolSpec  # noqa: E402
from overload_calibrate import calibrate, wait_idle  # noqa: E402
from overload_client import Attempt, Behaviour, Client  # noqa: E402
from overload_tokenweir import Tokenweir, TokenweirAlt  # noqa: E402
from overload_workload import (  # noqa: E402
    Arrival,
    Phase,
    load_sample,
    mean_lengths,
    pool_capacity_rps,
    schedule,
)

from backends.profiles import get_profile  # noqa: E402

MODEL = "llama-3.1-8b"
KEYS = {
    "interactive": [f"tw-bench-interactive-{i}" for i in range(4)],
    "batch": [f"tw-bench-batch-{i}" for i in range(4)],
}


def ladder_policy() -> dict[str, Any]:
    """Keys merged into bench/overload_policy.yaml: examples/mesh.yaml's shed step on the pool,
    and the ``degrade`` plugin after ``lane`` on the route (it applies the ladder)."""
    policy = yaml.safe_load(POLICY.read_text())
    routes = policy["gateways"]["edge"]["routes"]
    for route in routes:
        plugins = route["filters"]["plugins"]
        if "degrade" not in plugins:
            plugins.insert(plugins.index("lane") + 1, "degrade")
    ladder = {
        "min_dwell": "5s",
        "steps": [{"action": "shed", "enter_at": 1.5, "leave_at": 1.2, "lanes": ["batch"]}],
    }
    return {"pools": {"chat": {"degradation": ladder}}, "gateways": {"edge": {"routes": routes}}}


LADDER = ladder_policy()
_STEP = re.compile(rb'^tokenweir_filters_ladder_step\{pool="chat"\} ([0-9.eE+-]+)$', re.M)


@dataclass(frozen=True)
class Setup:
    replicas: int
    running: int
    time_scale: float
    length_scale: int
    base: float  # steady load, x capacity
    clients: int  # the storm's batch requests
    before: float
    spike: float
    after: float
    patience: float  # seconds a client waits for its first token
    max_attempts: int
    seed: int


def workload(s: Setup, records: Any, cap: float) -> tuple[list[Arrival], set[int]]:
    """Steady arrivals through the whole run and the storm's batch requests; the indexes of the
    storm's requests."""
    total = s.before + s.spike + s.after
    steady = schedule(
        records, [Phase(total, s.base)], capacity_rps=cap, interactive_share=0.3,
        tenants_per_lane=4, length_scale=s.length_scale, rng=random.Random(f"{s.seed}:steady"),
    )  # fmt: skip
    rate = s.clients / s.spike / cap  # x capacity, batch only
    storm = schedule(
        records, [Phase(s.spike * 3, rate)], capacity_rps=cap, interactive_share=0.0,
        tenants_per_lane=4, length_scale=s.length_scale, rng=random.Random(f"{s.seed}:storm"),
    )[: s.clients]  # fmt: skip
    storm = [
        Arrival(s.before + a.at * s.spike / max(storm[-1].at, 1e-9), a.lane, a.tenant,
                a.prompt, a.prompt_tokens, a.max_tokens)
        for a in storm
    ]  # fmt: skip
    both = sorted([(a, False) for a in steady] + [(a, True) for a in storm], key=lambda x: x[0].at)
    return [a for a, _ in both], {i for i, (_, st) in enumerate(both) if st}


async def ladder_steps(http: aiohttp.ClientSession, url: str | None) -> float | None:
    if url is None:
        return None
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
            m = _STEP.search(await r.read())
    except (aiohttp.ClientError, TimeoutError):
        return None
    return float(m.group(1)) if m else None


async def drive(arm: Any, arrivals: list[Arrival], b: Behaviour, s: Setup) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    steps: list[tuple[float, float]] = []
    async with (
        aiohttp.ClientSession(connector=conn, timeout=timeout) as http,
        aiohttp.ClientSession() as probe,
    ):
        client = Client(
            http, arm.url, model=MODEL, keys=KEYS,
            patience={"interactive": s.patience, "batch": s.patience}, behaviour=b,
            clock=loop.time, rng=random.Random(s.seed),
        )  # fmt: skip
        client.start()
        stop = asyncio.Event()

        async def sampler() -> None:
            while not stop.is_set():
                step = await ladder_steps(probe, arm.queue_metrics_url)
                if step is not None:
                    steps.append((round(client.now(), 2), step))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)

        task = asyncio.create_task(sampler())
        try:
            await asyncio.gather(*(client.run(i, a) for i, a in enumerate(arrivals)))
        finally:
            stop.set()
            await task
    return {"attempts": client.attempts, "steps": steps, "end": client.now()}


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def summarize(
    got: dict[str, Any], arrivals: list[Arrival], storm: set[int], s: Setup
) -> dict[str, Any]:
    attempts: list[Attempt] = got["attempts"]
    spike_end = s.before + s.spike
    end = s.before + s.spike + s.after
    by_req: dict[int, list[Attempt]] = {}
    for a in attempts:
        by_req.setdefault(a.request, []).append(a)
    ok = {r for r, xs in by_req.items() if any(a.ok for a in xs)}
    storm_attempts = sum(len(by_req.get(r, [])) for r in storm)
    storm_ok = len(ok & storm)
    # goodput: streamed tokens per 1 s bucket
    buckets = [0] * (int(max(got["end"], end)) + 2)
    for a in attempts:
        for t in a.token_times:
            buckets[int(t)] += 1
    pre = sum(buckets[1 : int(s.before)]) / max(1, int(s.before) - 1)
    # back to the pre-spike level: from this second on, every 2 s window up to 15 s after the
    # spike's end streams at least 90% of the pre-spike goodput (None: never within 15 s)
    horizon = int(min(end, spike_end + 15.0))
    recovered = None
    for t in range(int(spike_end), horizon - 1):
        if all(sum(buckets[u : u + 2]) / 2 >= 0.9 * pre for u in range(t, horizon - 1)):
            recovered = round(t - spike_end, 1)
            break
    after_gp = sum(buckets[int(spike_end) : int(end)]) / max(1, int(end) - int(spike_end))
    # fresh batch after the spike (the steady 30%-of-capacity lane)
    fresh = [i for i, a in enumerate(arrivals) if i not in storm and a.lane == "batch"
             and spike_end <= a.at < end]  # fmt: skip
    first_ok = [i for i in fresh if by_req.get(i) and by_req[i][0].ok]
    served = [i for i in fresh if i in ok]
    # interactive probe per phase
    inter: dict[str, Any] = {}
    for name, lo, hi in (("before", 0, s.before), ("spike", s.before, spike_end),
                         ("after", spike_end, end)):  # fmt: skip
        idx = [i for i, a in enumerate(arrivals) if a.lane == "interactive" and lo <= a.at < hi]
        ttft = [
            1000 * (x.first_token - x.sent)
            for i in idx for x in by_req.get(i, []) if x.first_token is not None
        ]  # fmt: skip
        inter[name] = {
            "requests": len(idx),
            "success": round(sum(1 for i in idx if i in ok) / max(1, len(idx)), 3),
            "ttft_ms_p50": _p(ttft, 0.5),
            "ttft_ms_p95": _p(ttft, 0.95),
        }
    steps = got["steps"]
    changes = sum(1 for (_, a), (_, b) in itertools.pairwise(steps) if a != b)
    # seconds the ladder spent shedding after the spike's end (samples every 0.25 s)
    shed_after = sum(
        b[0] - a[0] for a, b in itertools.pairwise(steps) if a[0] >= spike_end and a[1] >= 1
    )
    return {
        "storm": {
            "requests": len(storm),
            "served": storm_ok,
            "gave_up": len(storm) - storm_ok,
            "attempts": storm_attempts,
            "attempts_per_success": round(storm_attempts / storm_ok, 2) if storm_ok else None,
        },
        "goodput_tok_s": {
            "before": round(pre, 1),
            "after_mean": round(after_gp, 1),
            "per_second": buckets[: int(end) + 1],
        },
        "recovered_s": recovered,
        "fresh_batch_after": {
            "requests": len(fresh),
            "served": round(len(served) / max(1, len(fresh)), 3),
            "served_first_attempt": round(len(first_ok) / max(1, len(fresh)), 3),
        },
        "interactive": inter,
        "ladder": {
            "changes": changes,
            "shed_after_spike_end_s": round(shed_after, 2),
            "changes_at": [t for (_, a), (t, b) in itertools.pairwise(steps) if a != b],
            "steps": steps,
        },
    }


def _row(arm: str, b: str, r: dict[str, Any]) -> str:
    st, fb, i = r["storm"], r["fresh_batch_after"], r["interactive"]
    return (
        f"| {arm} | {b} | {st['attempts_per_success']} | {st['gave_up']}/{st['requests']} | "
        f"{r['goodput_tok_s']['before']} | {r['goodput_tok_s']['after_mean']} | "
        f"{r['recovered_s']} | {fb['served']} ({fb['served_first_attempt']}) | "
        f"{i['before']['ttft_ms_p95']} / {i['spike']['ttft_ms_p95']} / {i['after']['ttft_ms_p95']}"
        f" ({i['after']['success']}) | {r['ladder']['changes']} | "
        f"{r['ladder']['shed_after_spike_end_s']} |"
    )


def report(result: dict[str, Any]) -> str:
    lines = [
        f"Retry storm, {result['started']}; capacity {result['capacity_rps']} req/s; "
        f"load average {result['load_average_start']} → {result['load_average_end']}",
        "",
        "| arm | clients | attempts/success (storm) | gave up | goodput before (tok/s) | "
        "after (mean) | recovered (s after spike) | fresh batch after: served (1st try) | "
        "interactive TTFT p95 ms before / spike / after (success after) | ladder changes | "
        "shedding after the spike (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_b in result["arms"].items():
        for b, r in by_b.items():
            lines.append(_row(arm, b, r))
    return "\n".join(lines) + "\n"


async def run(s: Setup, baseline: Path | None, out: Path) -> dict[str, Any]:
    profile = get_profile("llama-3.1-8b-h100")
    records = load_sample()
    mean_p, mean_o = mean_lengths(records, s.length_scale)
    model_cap = pool_capacity_rps(
        profile, replicas=s.replicas, running=s.running, mean_prompt=mean_p,
        mean_output=mean_o, time_scale=s.time_scale,
    )  # fmt: skip
    spec0 = PoolSpec(s.replicas, s.running, profile.name, s.time_scale, model_cap, 10.0)
    with tempfile.TemporaryDirectory(prefix="tw-storm-cal-") as tmp:
        cap = await calibrate(spec0, records, s.seed, s.length_scale, Path(tmp), 6.0, 2.0)
    print(f"capacity measured: {cap:.2f} req/s", flush=True)
    spec = PoolSpec(s.replicas, s.running, profile.name, s.time_scale, cap, 10.0)
    arrivals, storm = workload(s, records, cap)
    result: dict[str, Any] = {
        "setup": s.__dict__, "capacity_rps": round(cap, 3), "arrivals": len(arrivals),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "baseline_src": str(baseline) if baseline else None, "arms": {},
    }  # fmt: skip
    behaviours = {  # polite: exactly as told (the herd case), and with 0..25% jitter; naive
        "polite": Behaviour("honour", max_attempts=s.max_attempts, jitter=0.0, retry_untold=True),
        "polite-jitter": Behaviour("honour", max_attempts=s.max_attempts, retry_untold=True),
        "naive": Behaviour("immediate", max_attempts=s.max_attempts),
    }
    with tempfile.TemporaryDirectory(prefix="tw-storm-") as tmp:
        arms: dict[str, Any] = {}
        try:
            for name in ("main", "branch") if baseline is not None else ("branch",):
                d = Path(tmp) / name
                d.mkdir()
                pool = EmulatorPool(spec, d)
                arm = TokenweirAlt(pool, d, baseline) if name == "main" else Tokenweir(pool, d)
                arm.overrides = LADDER
                arms[name] = arm
            for arm in arms.values():
                await arm.pool.start(arm.name)
                await arm.start()
            for label, b in behaviours.items():
                for name, arm in arms.items():  # side by side: each arm, same arrivals
                    await wait_idle(arm)
                    got = await drive(arm, arrivals, b, s)
                    r = summarize(got, arrivals, storm, s)
                    result["arms"].setdefault(name, {})[label] = r
                    print(_row(name, label, r), flush=True)
        finally:
            for arm in arms.values():
                await arm.aclose()
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(report(result))
    print(report(result))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-src", type=Path, default=None, help="main's code (git archive)")
    ap.add_argument("--smoke", action="store_true", help="seconds, this checkout only")
    ap.add_argument("--clients", type=int, default=160)
    ap.add_argument("--base", type=float, default=0.3, help="steady load, x capacity")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--running", type=int, default=8, help="slots per replica (reduced)")
    ap.add_argument("--after", type=float, default=20.0, help="seconds after the spike")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "storm")
    a = ap.parse_args(argv)
    if a.smoke:
        s = Setup(1, 4, 1.0, 32, a.base, 20, 1.0, 1.0, 3.0, 2.0, 5, a.seed)
    else:
        s = Setup(a.replicas, a.running, 5.0, 16, a.base, a.clients, 5.0, 3.0, a.after, 10.0,
                  50, a.seed)  # fmt: skip
    asyncio.run(run(s, a.baseline_src, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
