"""Overload benchmark (issue 10): plain Envoy, sglang-router and tokenweir side by side in one run,
each on its own fresh pool of emulated SGLang replicas, at 0.25x (the unloaded reference), 1x,
2x and 3x the pool's capacity, 30% interactive / 70% batch, Mooncake token lengths, streaming;
then a retry storm (a spike, with clients that honour Retry-After and clients that retry at once).

    .venv/bin/python bench/overload.py            # the full run (about 8 minutes here)
    .venv/bin/python bench/overload.py --smoke    # seconds: CI runs it (tests/bench)
    .venv/bin/python bench/overload.py --scale 4  # 4x the replicas' slots and the durations
    # before/after a change, in one run: main's code in the tokenweir-baseline arm
    git archive main | tar -x -C /tmp/tw-main
    .venv/bin/python bench/overload.py --arms tokenweir-baseline tokenweir --baseline-src /tmp/tw-main
    # every request attempt by attempt (status, shed reason, Retry-After, TTFT) as JSON lines
    .venv/bin/python bench/overload.py --levels 3 --arms tokenweir --rows /tmp/rows.jsonl
    # a policy or backend setting beside the default, in one run
    .venv/bin/python bench/overload.py --levels 3 --arms tokenweir tokenweir-variant \
        --variant-policy '{admission: {batch: {max_share: 0.4}}}'
    .venv/bin/python bench/overload.py --levels 3 --arms tokenweir tokenweir-variant \
        --variant-emulator-args '--chunked-prefill-size 1024'

Writes ``bench/results/overload.json``, ``bench/results/overload.md`` and PNG plots in
``docs/img/`` (``--out-dir`` / ``--img-dir`` move them). docs/benchmarks.md ("Overload") explains
the setup, every column and the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import yaml

HERE = Path(__file__).resolve().parent
LAG_TICK = 0.02  # seconds between the client's loop-lag probes
sys.path[:0] = [str(HERE.parent), str(HERE)]

from overload_arms import ARMS, EXTRA_ARMS, MODEL, Arm, EmulatorPool, PoolSpec  # noqa: E402
from overload_calibrate import calibrate, wait_idle  # noqa: E402
from overload_client import Behaviour, Client  # noqa: E402
from overload_config import Config, config  # noqa: E402
from overload_gateway_log import AccessLogTail, rejection_durations  # noqa: E402
from overload_gateway_log import summary as log_summary  # noqa: E402
from overload_report import write_outputs  # noqa: E402
from overload_rows import rows as request_rows  # noqa: E402
from overload_scrape import replica_states, scrape  # noqa: E402
from overload_stats import replica_lane_summary, summarize, targets, timeline  # noqa: E402
from overload_tokenweir import Variant, make_arm  # noqa: E402
from overload_workload import (  # noqa: E402
    Arrival,
    Phase,
    load_sample,
    mean_lengths,
    pool_capacity_rps,
    schedule,
    spike_phases,
)

from backends.profiles import get_profile  # noqa: E402

_T0 = time.monotonic()
INTERACTIVE_PRIORITY = 100  # bench/overload_policy.yaml's interactive lane (the default)
KEYS = {
    "interactive": [f"tw-bench-interactive-{i}" for i in range(4)],
    "batch": [f"tw-bench-batch-{i}" for i in range(4)],
}


async def drive(
    arm: Arm,
    arrivals: list[Arrival],
    behaviour: Behaviour,
    patience: dict[str, float],
    seed: int,
    sample_every: float,
) -> dict[str, Any]:
    """Send ``arrivals`` to ``arm``; return every attempt and the queue samples."""
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=timeout) as http,
        aiohttp.ClientSession() as probe,
    ):
        client = Client(
            http, arm.url, model=MODEL, keys=KEYS, patience=patience, behaviour=behaviour,
            clock=loop.time, rng=random.Random(seed),
        )  # fmt: skip
        client.start()
        samples: list[dict[str, float]] = []
        replicas: list[list[dict[str, Any] | None]] = []  # each emulator's own view, per sample
        stop = asyncio.Event()

        async def sampler() -> None:
            while not stop.is_set():
                t = client.now()
                row = {
                    "t": round(t, 3),
                    **{f"waiting_{k}": float(v) for k, v in client.waiting().items()},
                }
                row.update(await scrape(probe, arm))
                samples.append(row)
                replicas.append(await replica_states(probe, arm))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), sample_every)

        lags: list[float] = []

        async def lag_probe() -> None:
            """The client's own event-loop lag: every latency it measures includes it."""
            while not stop.is_set():
                t = loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), LAG_TICK)
                lags.append(max(0.0, loop.time() - t - LAG_TICK))

        task = asyncio.create_task(sampler())
        lag_task = asyncio.create_task(lag_probe())
        try:
            await asyncio.gather(*(client.run(i, a) for i, a in enumerate(arrivals)))
        finally:
            stop.set()
            await task
            await lag_task
    return {
        "attempts": client.attempts,
        "samples": samples,
        "replicas": replicas,
        "end": client.now(),
        "client_lag_ms": lag_summary(lags),
    }


def lag_summary(lags: list[float]) -> dict[str, float]:
    """p50 / p99 / max of the client's loop lag, in ms."""
    if not lags:
        return {}
    xs = sorted(lags)

    def at(q: float) -> float:
        return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 1)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(1000 * xs[-1], 1)}


def _level_key(m: float) -> str:
    return f"{m:g}x"


async def run(
    cfg: Config,
    out_dir: Path,
    img_dir: Path,
    baseline: Path | None = None,
    rows_path: Path | None = None,
    variant: Variant | None = None,
) -> dict[str, Any]:
    profile = get_profile("llama-3.1-8b-h100")
    records = load_sample()
    mean_p, mean_o = mean_lengths(records, cfg.length_scale)
    model_cap = pool_capacity_rps(
        profile, replicas=cfg.replicas, running=cfg.running, mean_prompt=mean_p,
        mean_output=mean_o, time_scale=cfg.time_scale,
    )  # fmt: skip
    print(
        f"pool: {cfg.replicas} x {profile.name} (time_scale {cfg.time_scale:g}, "
        f"{cfg.running} running each); mean prompt {mean_p:.0f} / output {mean_o:.1f} tokens "
        f"(lengths / {cfg.length_scale}); capacity by the profile {model_cap:.2f} req/s",
        flush=True,
    )
    spec0 = PoolSpec(cfg.replicas, cfg.running, profile.name, cfg.time_scale, model_cap, 10.0)
    with tempfile.TemporaryDirectory(prefix="tw-overload-cal-") as tmp:
        cap = await calibrate(
            spec0, records, cfg.seed, cfg.length_scale, Path(tmp), *cfg.calibration
        )
    print(
        f"[{time.monotonic() - _T0:6.1f}s] capacity measured (closed loop, every slot busy): "
        f"{cap:.2f} req/s",
        flush=True,
    )
    spec = PoolSpec(cfg.replicas, cfg.running, profile.name, cfg.time_scale, cap, 10.0)
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "capacity_rps": round(cap, 3),
        "capacity_rps_by_profile": round(model_cap, 3),
        "mean_prompt_tokens": round(mean_p, 1),
        "mean_output_tokens": round(mean_o, 2),
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "baseline_src": str(baseline) if baseline is not None else None,
        "variant": asdict(variant) if variant is not None else None,
        "levels": {},
        "storm": {},
        "samples": {},
        "timelines": {},
    }
    honour = Behaviour("honour", max_attempts=cfg.max_attempts, max_wait=cfg.retry_wait)
    with tempfile.TemporaryDirectory(prefix="tw-overload-") as tmp:
        arms: dict[str, Arm] = {}
        try:
            for name in cfg.arms:
                run_dir = Path(tmp) / name
                run_dir.mkdir()
                pool = EmulatorPool(spec, run_dir)
                arms[name] = make_arm(name, pool, run_dir, baseline, variant)
            await asyncio.gather(*(_start(arm) for arm in arms.values()))
            print(f"[{time.monotonic() - _T0:6.1f}s] arms started", flush=True)
            for m in cfg.levels:
                rng = random.Random(f"{cfg.seed}:{m}")
                arrivals = schedule(
                    records, [Phase(cfg.duration, m)], capacity_rps=cap,
                    interactive_share=cfg.interactive_share, tenants_per_lane=4,
                    length_scale=cfg.length_scale, rng=rng,
                )  # fmt: skip
                for name, arm in arms.items():  # side by side: every arm at this level
                    sent = [a for a in arrivals if arm.lanes is None or a.lane in arm.lanes]
                    await wait_idle(arm)
                    tail = AccessLogTail(arm.access_log) if arm.access_log else None
                    if tail is not None:
                        tail.mark()
                    got = await drive(arm, sent, honour, cfg.patience, cfg.seed, cfg.sample_every)
                    key = _level_key(m)
                    if tail is not None:  # the same rejections, timed by the gateway itself
                        lines = tail.since_mark()
                        gw = {
                            "all": log_summary(rejection_durations(lines)),
                            "at_arrival": log_summary(rejection_durations(lines, at_arrival=True)),
                        }
                        result.setdefault("gateway_rejection_ms", {}).setdefault(name, {})[key] = gw
                        print(f"    {name} {key}: gateway-timed rejections {gw}", flush=True)
                    summary = summarize(got["attempts"], window=(cfg.warmup, cfg.duration))
                    result["levels"].setdefault(name, {})[key] = summary
                    result["samples"].setdefault(name, {})[key] = got["samples"]
                    lanes = result.setdefault("replica_lanes", {}).setdefault(name, {})
                    lanes[key] = replica_lane_summary(got["replicas"], INTERACTIVE_PRIORITY)
                    lag = result.setdefault("client_lag_ms", {}).setdefault(name, {})
                    lag[key] = got["client_lag_ms"]
                    _print_row(name, key, len(sent), summary)
                    if rows_path is not None:
                        with rows_path.open("a") as f:
                            for row in request_rows(name, key, got["attempts"]):
                                f.write(json.dumps(row) + "\n")
            await _storms(cfg, arms, records, cap, result)
        finally:
            await asyncio.gather(*(arm.aclose() for arm in arms.values()))
    result["load_average_end"] = os.getloadavg()
    result["targets"] = {n: targets(levels) for n, levels in result["levels"].items()}
    write_outputs(result, out_dir, img_dir)
    return result


async def _start(arm: Arm) -> None:
    await arm.pool.start(arm.name)
    await arm.start()


async def _storms(
    cfg: Config, arms: dict[str, Arm], records: Any, cap: float, result: dict[str, Any]
) -> None:
    base, spike, before, during, after = cfg.storm
    rng = random.Random(f"{cfg.seed}:storm")
    arrivals = schedule(
        records, spike_phases(base, spike, before, during, after), capacity_rps=cap,
        interactive_share=cfg.interactive_share, tenants_per_lane=4,
        length_scale=cfg.length_scale, rng=rng,
    )  # fmt: skip
    patience = {"interactive": cfg.storm_patience, "batch": cfg.storm_patience}
    behaviours = (
        Behaviour(
            "honour",
            max_attempts=cfg.storm_max_attempts,
            retry_untold=True,
            max_wait=cfg.retry_wait,
        ),
        Behaviour("immediate", max_attempts=cfg.storm_max_attempts),
    )
    total = before + during + after
    for name in cfg.storm_arms:
        arm = arms.get(name)
        if arm is None:
            continue
        for b in behaviours:
            await wait_idle(arm)
            got = await drive(arm, arrivals, b, patience, cfg.seed, cfg.sample_every)
            summary = summarize(got["attempts"], window=(0.0, total))
            tl = timeline(got["attempts"], bucket=0.5, end=max(got["end"], total))
            result["storm"].setdefault(name, {})[b.name] = {
                "summary": summary["all"],
                "base_rps": round(base * cap, 3),
                "spike": [before, before + during],
                "arrivals": len(arrivals),
            }
            result["timelines"].setdefault(name, {})[b.name] = tl
            s = summary["all"]
            print(
                f"[{time.monotonic() - _T0:6.1f}s] storm {name:13s} {b.name:9s} attempts/success {s['attempts_per_success']} "
                f"success {s['success_rate']} attempts {s['attempts']} for {s['requests']} requests",
                flush=True,
            )


def _print_row(arm: str, level: str, n: int, s: dict[str, dict[str, Any]]) -> None:
    i, b, a = s["interactive"], s["batch"], s["all"]
    print(
        f"[{time.monotonic() - _T0:6.1f}s] {arm:13s} {level:>5s} n={n:4d} goodput {a['goodput_tok_s']} tok/s | interactive "
        f"TTFT p95 {i['ttft_ms']['p95']} ms success {i['success_rate']} | batch TTFT p95 "
        f"{b['ttft_ms']['p95']} ms success {b['success_rate']} | rejections {a['rejections']} "
        f"p99 {a['rejection_ms_p99']} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run (CI)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply slots and durations")
    ap.add_argument("--levels", type=float, nargs="+", default=[0.25, 1.0, 2.0, 3.0])
    ap.add_argument("--duration", type=float, default=None, help="seconds per level (12 x scale)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + EXTRA_ARMS)
    ap.add_argument("--storm-arms", nargs="*", default=["envoy", "tokenweir"], choices=ARMS)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--running", type=int, default=16, help="max running requests per replica")
    ap.add_argument("--time-scale", type=float, default=5.0, help="emulated durations x this")
    ap.add_argument("--length-scale", type=int, default=16, help="trace lengths / this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--baseline-src", type=Path, default=None,
        help="a checkout (e.g. `git archive main`) whose code the tokenweir-baseline arm runs",
    )  # fmt: skip
    ap.add_argument(
        "--variant-policy", type=yaml.safe_load, default={},
        help="the tokenweir-variant arm: keys merged into bench/overload_policy.yaml, as YAML "
             "or JSON, e.g. '{admission: {batch: {max_share: 0.4}}}'",
    )  # fmt: skip
    ap.add_argument(
        "--variant-emulator-args", default="",
        help="the tokenweir-variant arm: flags added to its emulators, e.g. "
             "'--chunked-prefill-size 1024'",
    )  # fmt: skip
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument(
        "--rows", type=Path, default=None,
        help="append every request, attempt by attempt, as JSON lines (bench/overload_rows.py)",
    )  # fmt: skip
    ap.add_argument("--img-dir", type=Path, default=HERE.parent / "docs" / "img")
    a = ap.parse_args(argv)
    cfg = config(a)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run
    if a.rows is not None:
        a.rows.unlink(missing_ok=True)
    if not isinstance(a.variant_policy, dict):
        ap.error("--variant-policy must be a mapping")
    variant = Variant(a.variant_policy, tuple(a.variant_emulator_args.split()))
    result = runner(run(cfg, a.out_dir, a.img_dir, a.baseline_src, a.rows, variant))
    print(json.dumps(result["targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
