"""Autoscaling on a 1x → 3x → 1x ramp (issue 42): the online planner beside fixed provisioning
for the peak and a queue-depth threshold autoscaler (a KEDA rule on ``sglang:num_queue_reqs``),
one after the other in one run, on the same trace, the same emulated replicas and the same load
time.

Each arm runs the real mesh in this process (``tokenweir.up.Mesh``: Envoy, the control
plane, emulator replicas started and drained by ``up``'s fleet) and sends streamed chat
completions through the gateway at the trace's rate (Poisson arrivals). Only the source of the
desired count differs between arms:

- ``planner``: the control plane's online planner (``pools.chat.autoscale``).
- ``fixed-peak``: the count the planner's model needs at the peak rate, with the same headroom,
  from the start (what provisioning for the peak buys).
- ``queue-depth``: ``ceil(sum(num_queue_reqs) / per_replica)`` over the pool's replicas, kept
  for ``scale_down_window`` before going down (the HPA's stabilization), like KEDA's Prometheus
  trigger on ``sglang:num_queue_reqs``; bounds as the planner's.

Every replica runs with ``--max-running-requests`` at the planner's batch size (the TBT budget's
``c``), so a queue forms where the planner says a replica is full. A request meets the SLO when
its TTFT is within the interactive lane's ``ttft_budget`` and its mean time between tokens within
``tbt_budget``. Replica-minutes count every started replica, loading and draining included;
the hindsight-optimal schedule is the planner's model with no headroom, no forecast and no
load time, applied to the trace's true rate at each second.

    python bench/autoscale_ramp.py            # ~6 minutes on 2 cores; writes bench/results/
    python bench/autoscale_ramp.py --stretch 3 --out bench/results/autoscale_ramp_x3.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.autoscale import Demand, replicas_for  # noqa: E402
from controlplane.planner import profile_replica  # noqa: E402
from policy import load_policy  # noqa: E402
from runtime.ports import free_port, free_port_block  # noqa: E402
from tokenweir.up import Mesh  # noqa: E402

PROFILE, SCALE, TBT, TTFT, OUT, LOAD_S = "seed-2k", 10.0, 0.107, 3.0, 24, 6.0
MAX = 6
SLOTS = 4  # the TBT budget's batch: itl(4) = 106.4 ms ≤ 107 ms < itl(5) (seed-2k, time scale 10)


def policy_text(gw: int, base: int, xds: int, metrics: int) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}, drain_timeout: 60s}}
admission: {{interactive: {{ttft_budget: {TTFT}s}}}}
pools:
  chat:
    models: [m]
    endpoints_file: chat.endpoints
    emulated: {{replicas: 1, profile: {PROFILE}, base_port: {base}, time_scale: {SCALE}}}
    capacity: {{max_running_requests: {SLOTS}}}
    autoscale:
      min_replicas: 1
      max_replicas: {MAX}
      headroom: 0.3
      tbt_budget: {TBT * 1000:g}ms
      interval: 0.5s
      window: 10s
      forecast: {LOAD_S + 2:g}s
      scale_up_cooldown: 1s
      scale_down_cooldown: 6s
      scale_down_window: 10s
      load_time: {LOAD_S:g}s
      drain_timeout: 60s
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: chat, pool: chat, match: {{prefix: /}}}}
"""


def trace(base_rps: float, stretch: float = 1.0) -> list[tuple[float, float]]:
    """(seconds from start, rate) knots: 1x, ramp up, 3x, ramp down, 1x; every phase
    ``stretch`` times as long (the load time and the planner's keys stay as they are)."""
    return [(t * stretch, r * base_rps) for t, r in
            ((0, 1), (20, 1), (35, 3), (65, 3), (80, 1), (110, 1))]  # fmt: skip


def rate_at(knots: list[tuple[float, float]], t: float) -> float:
    for (t0, r0), (t1, r1) in itertools.pairwise(knots):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
    return knots[-1][1]


@dataclasses.dataclass
class Result:
    sent: int = 0
    ok: int = 0  # within TTFT and TBT budgets
    failed: int = 0  # no [DONE]
    ttft: list[float] = dataclasses.field(default_factory=list)
    tbt: list[float] = dataclasses.field(default_factory=list)
    # each request without [DONE]: when, the status, the error or body, chunks received
    failures: list[dict[str, object]] = dataclasses.field(default_factory=list)


async def one(http: aiohttp.ClientSession, gw: int, res: Result, t_start: float) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": OUT, "stream": True}  # fmt: skip
    t0 = time.monotonic()
    first = last = None
    n, done = 0, False
    res.sent += 1
    status, error, text, retry = 0, "", "", None
    try:
        async with http.post(f"http://127.0.0.1:{gw}/v1/chat/completions", json=body) as r:
            status, retry = r.status, r.headers.get("retry-after")
            if r.status != 200:
                text = (await r.text())[:300]
            async for raw in r.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data:") and '"content"' in line:
                    now = time.monotonic()
                    first = now if first is None else first
                    last, n = now, n + 1
                elif line.startswith("data:") and '"error"' in line:
                    text = line[:300]
    except (aiohttp.ClientError, TimeoutError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    if not done or first is None or last is None:
        res.failed += 1
        res.failures.append({
            "at_s": round(t0 - t_start, 2), "after_s": round(time.monotonic() - t0, 2),
            "status": status, "retry_after": retry, "error": error, "body": text, "chunks": n,
        })  # fmt: skip
        return
    ttft = first - t0
    tbt = (last - first) / (n - 1) if n > 1 else 0.0
    res.ttft.append(ttft)
    res.tbt.append(tbt)
    res.ok += ttft <= TTFT and tbt <= TBT


def desired_queue(mesh: Mesh, per_replica: float, window: float, state: dict[str, float]):
    """KEDA-like: ceil(queue / per_replica), scale-down after ``window`` of lower values."""
    hist: list[tuple[float, int]] = []

    def desired() -> int:
        assert mesh.plane is not None
        s = mesh.plane.scraper.state.pools.get("chat")
        q = sum(r.queued for r in s.fresh) if s is not None else 0
        now = time.monotonic()
        want = min(MAX, max(1, math.ceil(q / per_replica)))
        hist.append((now, want))
        while hist and hist[0][0] < now - window:
            hist.pop(0)
        cur = int(state.get("cur", 1))
        cur = want if want > cur else max(w for _, w in hist)
        state["cur"] = cur
        return cur

    return desired


async def arm(
    name: str, base_rps: float, peak_n: int, seed: int, stretch: float = 1.0
) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix=f"tw-autoscale-{name}-"))
    gw, xds, metrics, base = free_port(), free_port(), free_port(), free_port_block(MAX)
    (work / "mesh.yaml").write_text(policy_text(gw, base, xds, metrics))
    policy = load_policy(work / "mesh.yaml")
    mesh = Mesh(work / "mesh.yaml", policy, work / "run", redis_url=None, delta=True,
                autoscale=(name == "planner"))  # fmt: skip
    await mesh.start()
    fleet = mesh.fleets["chat"]
    if name == "fixed-peak":
        fleet.start(desired=lambda: peak_n)
    elif name == "queue-depth":
        fleet.start(desired=desired_queue(mesh, per_replica=2.0, window=10.0, state={}))
    knots = trace(base_rps, stretch)
    # fixed-peak: wait until the peak's replicas serve (provisioned before the traffic)
    while name == "fixed-peak" and len(fleet.serving()) < peak_n:
        await asyncio.sleep(0.5)
    res = Result()
    rng = random.Random(seed)
    replica_s = 0.0
    counts: list[tuple[float, int, int]] = []
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        t0 = time.monotonic()
        nxt = t0
        last = t0
        end = t0 + knots[-1][0]
        while True:
            now = time.monotonic()
            replica_s += len(fleet.replicas) * (now - last)
            last = now
            if not counts or now - counts[-1][0] - t0 >= 1.0:
                counts.append((now - t0, len(fleet.replicas), len(fleet.serving())))
            if now >= end:
                break
            if now >= nxt:
                t = asyncio.create_task(one(http, gw, res, t0))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                nxt += rng.expovariate(max(rate_at(knots, now - t0), 1e-6))
            await asyncio.sleep(min(0.05, max(0.0, nxt - time.monotonic())))
        await asyncio.gather(*tasks)
    assert mesh.plane is not None
    planner = mesh.plane.autoscaler.to_json()["pools"].get("chat") if name == "planner" else None
    await mesh.aclose(5.0)
    optimal_s = sum(hindsight(rate_at(knots, s + 0.5)) for s in range(int(knots[-1][0])))
    return {
        "arm": name, "sent": res.sent, "slo_ok": res.ok, "failed": res.failed,
        "slo_attainment": res.ok / res.sent if res.sent else 0.0,
        "ttft_p95_s": _q(res.ttft, 0.95), "tbt_p95_s": _q(res.tbt, 0.95),
        "replica_minutes": replica_s / 60, "hindsight_replica_minutes": optimal_s / 60,
        "vs_hindsight": replica_s / optimal_s if optimal_s else math.inf,
        "cut_streams": fleet.cut_streams, "failures": res.failures, "work": str(work),
        "planner_at_end": planner,
        "replicas_by_second": counts,
    }  # fmt: skip


def _q(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


REPLICA = profile_replica(PROFILE)
DEMAND = Demand(prompt_mean=20.0, output_mean=float(OUT), measured=True)


def hindsight(rate: float) -> int:
    need = replicas_for(DEMAND, rate, REPLICA, ttft_s=TTFT, tbt_s=TBT, headroom=0.0,
                        time_scale=SCALE)  # fmt: skip
    return max(1, need.replicas)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rps", type=float, default=0.8)
    p.add_argument("--arms", default="planner,fixed-peak,queue-depth")
    p.add_argument(
        "--stretch",
        type=float,
        default=1.0,
        help="every phase of the trace this many times as long (load time kept)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/autoscale_ramp.json")
    a = p.parse_args()
    # the reloader's build worker runs at idle priority by default: on a busy shared box it
    # starved for minutes before an arm's first policy build (the arm never started)
    os.environ.setdefault("TOKENWEIR_BUILD_NICE", "0")
    peak = replicas_for(DEMAND, 3 * a.base_rps, REPLICA, ttft_s=TTFT, tbt_s=TBT, headroom=0.3,
                        time_scale=SCALE).replicas  # fmt: skip
    rows = []
    for _i, name in enumerate(a.arms.split(",")):
        row = asyncio.run(arm(name, a.base_rps, peak, seed=42, stretch=a.stretch))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "replicas_by_second"}), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"base_rps": a.base_rps, "stretch": a.stretch,
                                 "profile": PROFILE, "time_scale": SCALE, "tbt_budget_s": TBT, "ttft_budget_s": TTFT, "output_tokens": OUT,
                                 "load_time_s": LOAD_S, "fixed_peak_replicas": peak,
                                 "arms": rows}, indent=1) + "\n")  # fmt: skip
    print(f"{'arm':<12} {'SLO':>7} {'failed':>6} {'rep-min':>8} {'optimal':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['arm']:<12} {r['slo_attainment']:7.2%} {r['failed']:>6} "
              f"{r['replica_minutes']:8.2f} {r['hindsight_replica_minutes']:8.2f} "
              f"{r['vs_hindsight']:6.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
