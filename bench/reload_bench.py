"""Policy reload time at 10k and 100k tenants: load + build per process, and edit → applied.

For each size, a policy with that many tenants (one API key and own quotas each) and 100
routes (identity, tokens, usage on each) is written, then measured in this process:

- ``load``: :func:`policy.load_policy` alone (bounded compose + decode + checks);
- ``filters``: what the filter server's watcher runs off its loop (load + every plugin chain);
- ``ratelimit``: what the rate-limit service's watcher runs (load + decider settings);
- ``controlplane``: what the control plane's reloader runs (load + the services' check +
  render + snapshot consistency);
- ``edit→applied``: a real :class:`runtime.watcher.PolicyWatcher` (the control plane's reloader,
  poll 50 ms, debounce 50 ms, building in its worker process) from the file's replace to the
  snapshot being published;
- ``loop lag`` while each service reloads (every quota changed), side by side: the build in a
  thread of the serving process (before) and in the build worker process (now). A probe task
  sleeps 1 ms in a loop; its overshoot is how long a request would have waited for the loop.
  p99 and max over the reload, and the reload's wall time (the second reload of each arm: the
  first one starts the worker).

The CPU column of the lag arms is the loop thread's CPU time between two turns of the probe:
the longest step the loop ran without letting a request in (a busy machine inflates the
wall-clock lag, not this). ``--lag-only``: just those arms.

Medians of ``--repeat`` runs. Usage: ``.venv/bin/python bench/reload_bench.py [--sizes 10000
100000] [--repeat 3] [--lag-only]``. Writes bench/results/reload_bench.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from controlplane.reloader import Reloader
from controlplane.xds.cache import SnapshotCache
from filters.app import FilterApp, Settings
from policy import load_policy
from ratelimit_service.server import Service, ServiceSettings
from tests.bigpolicy import big_policy_text
from tokenweir.check import service_issues

RESULTS = Path(__file__).parent / "results" / "reload_bench.json"
PORTS = dict(
    xds=18000, cp_metrics=18001, listen=10000, ratelimit=18081, rl_metrics=18091,
    filters=18082, filters_metrics=18096,
)  # fmt: skip


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def _edit_to_applied(path: Path, tenants: int, repeat: int) -> float:
    cache = SnapshotCache()
    reloader = Reloader(
        path, cache, registry=CollectorRegistry(), debounce=0.05, poll_interval=0.05,
        check=service_issues, build_worker="tokenweir.check:reloader_prepare",
    )  # fmt: skip
    await reloader.start()
    times = []
    try:
        for gen in range(1, repeat + 1):
            routes = 100 + gen  # a route more: every node group gets a new snapshot
            text = big_policy_text(tenants=tenants, routes=routes, ports=PORTS, generation=gen)
            generation = cache.generation("edge")
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            start = time.perf_counter()
            tmp.replace(path)
            while cache.generation("edge") == generation:
                await asyncio.sleep(0.005)
            times.append(time.perf_counter() - start)
    finally:
        await reloader.aclose()
    return statistics.median(times)


async def _lagged(reload: Callable[[], Any]) -> tuple[float, float, float, float]:
    """(wall s, loop lag p99 s, loop lag max s, longest stall in CPU s) while ``reload()`` runs
    and the replaced value is freed. The CPU figure is the loop thread's CPU time between two
    turns of the probe: the longest run of work the loop did without letting a request in,
    which other processes' load on the machine does not inflate (the wall-clock lag does)."""
    lags: list[float] = []
    cpu: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            start, used = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - start - 0.001)
            cpu.append(time.thread_time() - used)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    out = await reload()
    wall = time.perf_counter() - start
    await asyncio.sleep(0.3)  # the replaced policy is freed after the swap
    done.set()
    await task
    assert getattr(out, "ok", True), out
    lags.sort()
    return wall, lags[int(len(lags) * 0.99)], lags[-1], max(cpu)


async def _lag_arms(path: Path, tenants: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gen = iter(range(100, 10_000))

    def edit() -> None:
        path.write_text(
            big_policy_text(tenants=tenants, routes=100, ports=PORTS, generation=next(gen))
        )

    for arm, worker in (("thread", False), ("worker", True)):
        edit()
        app = FilterApp(Settings(path, build_worker=worker), clock=time.monotonic)
        svc = Service(ServiceSettings(path, build_worker=worker), app.policy)
        cp = Reloader(
            path, SnapshotCache(), registry=CollectorRegistry(), check=service_issues,
            build_worker="tokenweir.check:reloader_prepare" if worker else None,
        )  # fmt: skip
        reloads: dict[str, Callable[[], Any]] = {
            "filters": app.reload, "ratelimit": svc.watcher.reload, "controlplane": cp.reload_async,
        }  # fmt: skip
        try:
            for name, reload in reloads.items():
                edit()
                await reload()  # the first: starts the worker, replaces the start-up state
                edit()
                wall, p99, worst, cpu = await _lagged(reload)
                out[f"{name}_{arm}"] = {
                    "wall_s": wall, "lag_p99_s": p99, "lag_max_s": worst, "stall_cpu_max_s": cpu,
                }  # fmt: skip
        finally:
            await app.aclose()
            await svc.watcher.aclose()
            await cp.aclose()
    return out


def measure(tenants: int, repeat: int, lag_only: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mesh.yaml"
        text = big_policy_text(tenants=tenants, routes=100, ports=PORTS)
        path.write_text(text)
        if lag_only:
            return {"tenants": tenants, "lag": asyncio.run(_lag_arms(path, tenants))}
        app = FilterApp(Settings(path), clock=time.monotonic)
        svc = Service(ServiceSettings(path), app.policy)
        cp = Reloader(path, SnapshotCache(), registry=CollectorRegistry(), check=service_issues)
        out = {
            "tenants": tenants,
            "routes": 100,
            "bytes": len(text),
            "load_s": _median(lambda: load_policy(path), repeat),
            "filters_s": _median(lambda: app._build(path), repeat),
            "ratelimit_s": _median(lambda: svc._build(path), repeat),
            "controlplane_s": _median(lambda: cp._build(path), repeat),
        }
        out["edit_to_applied_s"] = asyncio.run(_edit_to_applied(path, tenants, repeat))
        out["lag"] = asyncio.run(_lag_arms(path, tenants))
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lag-only", action="store_true", help="only the loop-lag arms; no file")
    args = ap.parse_args()
    header = (
        "| tenants | file | load | filters build | rate-limit build | control plane build "
        "| edit → applied |\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    print(header, flush=True)
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    lag_rows: list[dict[str, Any]] = []
    for n in args.sizes:
        r = measure(n, args.repeat, args.lag_only)
        if args.lag_only:
            lag_rows.append(r)
            continue
        rows = [row for row in rows if row["tenants"] != n] + [r]
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(rows, indent=2) + "\n")  # each size kept as it finishes
        print(
            f"| {r['tenants']:,} | {r['bytes'] / 1e6:.1f} MB | {r['load_s']:.2f} s "
            f"| {r['filters_s']:.2f} s | {r['ratelimit_s']:.2f} s | {r['controlplane_s']:.2f} s "
            f"| {r['edit_to_applied_s']:.2f} s |",
            flush=True,
        )
        lag_rows.append(r)
    print(
        "\n| tenants | process | build in | reload wall | loop lag p99 | loop lag max "
        "| longest stall (CPU) |\n|---:|---|---|---:|---:|---:|---:|"
    )
    for r in lag_rows:
        for key, m in r["lag"].items():
            name, arm = key.rsplit("_", 1)
            print(
                f"| {r['tenants']:,} | {name} | {arm} | {m['wall_s']:.2f} s "
                f"| {m['lag_p99_s'] * 1e3:.1f} ms | {m['lag_max_s'] * 1e3:.1f} ms "
                f"| {m.get('stall_cpu_max_s', float('nan')) * 1e3:.1f} ms |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
