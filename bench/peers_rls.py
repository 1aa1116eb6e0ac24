"""The rate-limit service alone (bench/peers.py's last phase): decisions/s and latency.

A private Redis and the service (built-in HTTP/2 transport, the policy of
``bench/ratelimit_bench.py``: reserves of 50–250 tokens for 100 tenants, bucket + monthly budget),
driven by ``bench/ratelimit_load.py``: first a closed loop of 200 callers (its maximum), then an
open loop at half that rate (latency from each call's scheduled time). CPU seconds of the service,
Redis and the load generator are recorded beside the wall time: on a 2-core machine their sum
shows whether the cores, not the service, set the ceiling.

Three setups side by side, each on a fresh service and Redis: the lean HTTP/2 load client
(``bench/h2_grpc_client.py``) against one service process and against two (SO_REUSEPORT), and
the grpc.aio client against one process (the load generator of earlier runs, whose own CPU per
call shared the cores with the service). The targets are read on the best of them.

Alone: ``.venv/bin/python bench/peers_rls.py --seconds 6 --out bench/results/rls.json``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peers_cpu import snapshot
from ratelimit_bench import Service, policy_text, service_p99_ms

from tests.helpers import free_port, redis_server

__all__ = ["merge_loads", "parse_setup", "rls_phase"]

LOAD = Path(__file__).resolve().parent / "ratelimit_load.py"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# (load client, service processes, load-generator processes)
SETUPS = (("h2", 1, 1), ("h2", 2, 1), ("grpc", 1, 1))


def parse_setup(text: str) -> tuple[str, int, int]:
    """``CLIENT:PROCESSES[:LOADERS]``, e.g. ``h2:4:2`` (the ``--setups`` argument)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("h2", "grpc"):
        raise ValueError(f"setup {text!r}: expected CLIENT:PROCESSES[:LOADERS], CLIENT h2 or grpc")
    processes, loaders = int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    if not 1 <= processes <= 9 or loaders < 1:
        raise ValueError(f"setup {text!r}: PROCESSES must be 1..9 and LOADERS >= 1")
    return parts[0], processes, loaders


def _load(
    port: int,
    seconds: float,
    concurrency: int,
    rate: float,
    client: str = "h2",
    processes: int = 1,
    loaders: int = 1,
) -> dict[str, Any]:
    """One load run; with ``loaders`` > 1, that many load processes share the concurrency and
    the rate, and their results are summed (p50: the loaders' median; p99: their maximum, an
    upper bound of the combined p99)."""
    conns = max(4, -(-4 * processes // loaders))  # >= 4 per service process across loaders
    argv = [sys.executable, str(LOAD), "--target", f"127.0.0.1:{port}", "--client", client,
            "--concurrency", str(max(1, concurrency // loaders)), "--seconds", str(seconds),
            "--rate", str(rate / loaders), "--connections", str(conns)]  # fmt: skip
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(loaders)]
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            if proc.returncode:
                raise RuntimeError(f"load generator failed (exit {proc.returncode})")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # a failed loader stops the others too
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return merge_loads(outs)


def merge_loads(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several load generators' results as one: counts and rates summed, the longest window,
    p50 the loaders' median p50, p99 their largest p99 (an upper bound of the combined p99:
    each loader saw the same service)."""
    if len(outs) == 1:
        return outs[0]
    keys = ("calls", "rps", "errors", "over_limit", "dropped", "offered_rps")
    summed = {k: round(sum(o[k] for o in outs), 3) for k in keys}
    return {
        **summed,
        "seconds": max(o["seconds"] for o in outs),
        "p50_ms": sorted(o["p50_ms"] for o in outs)[len(outs) // 2],
        "p99_ms": max(o["p99_ms"] for o in outs),
        "client": outs[0]["client"],
        "loaders": len(outs),
    }


def _measured(svc: Service, redis_pid: int, fn: Any) -> dict[str, Any]:
    pids = [svc.child.proc.pid, redis_pid]
    hist0, cpu0, client0, t0 = svc.hist(), snapshot(pids), _children_cpu(), time.monotonic()
    res = fn()
    wall = time.monotonic() - t0
    hist1, cpu1, client1 = svc.hist(), snapshot(pids), _children_cpu()
    used = {k: round(cpu1[k].seconds - (cpu0[k].seconds if k in cpu0 else 0.0), 3) for k in cpu1}
    used["load_generator"] = round(client1 - client0, 3)
    res["cpu_seconds"] = used
    res["wall_seconds"] = round(wall, 3)
    secs = res.get("seconds") or wall  # the load's own window (its start-up excluded)
    server = used.get("ratelimit_service", 0.0) + used.get("redis", 0.0)
    res["cores_busy"] = round(server / secs, 2) if secs else None  # service + Redis
    res["service_p99_ms"] = service_p99_ms(hist0, hist1)
    calls = res.get("calls") or 0
    res["service_cpu_us_per_decision"] = (
        round(used.get("ratelimit_service", 0.0) * 1e6 / calls, 1) if calls else None
    )
    return res


def rls_phase(
    tmp: Path,
    seconds: float,
    setups: tuple[tuple[str, int, int], ...] = SETUPS,
    warmup: float = 1.0,
) -> dict[str, Any]:
    """Every setup on a fresh service and Redis; ``warmup`` seconds of load before each (0: none,
    for the smoke run, whose numbers mean nothing)."""
    runs = [_setup(tmp, seconds, *setup, warmup=warmup) for setup in setups]
    best = max(runs, key=lambda r: float(r["closed_loop_c200"]["rps"]))
    return {
        "closed_loop_c200": best["closed_loop_c200"],
        "open_loop_half": best["open_loop_half"],
        "best": {"client": best["client"], "processes": best["processes"]},
        "setups": runs,
        "cpus": os.cpu_count(),
    }


def _setup(
    tmp: Path, seconds: float, client: str, processes: int, loaders: int = 1, warmup: float = 1.0
) -> dict[str, Any]:
    port = free_port()
    policy = tmp / f"rls-policy-{client}-{processes}.yaml"
    policy.write_text(policy_text(port))
    with redis_server() as redis_port:
        redis_pid = _redis_pid(redis_port)
        url = f"redis://127.0.0.1:{redis_port}/0"
        svc = Service(f"ours-{processes}", policy, url, port, tmp)
        try:
            if warmup > 0:
                _load(port, warmup, 50, 0.0, client, processes, loaders)
            closed = _measured(
                svc, redis_pid, lambda: _load(port, seconds, 200, 0.0, client, processes, loaders)
            )
            half = max(1.0, closed["rps"] / 2)
            open_ = _measured(
                svc, redis_pid, lambda: _load(port, seconds, 2000, half, client, processes, loaders)
            )
        finally:
            svc.close()
    return {
        "client": client,
        "processes": processes,
        "loaders": loaders,
        "closed_loop_c200": closed,
        "open_loop_half": open_,
    }


def _redis_pid(port: int) -> int:
    """The redis-server listening on ``port`` (its command line names the port)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and b"redis-server" in cmd[0] and str(port).encode() in b" ".join(cmd):
            return int(d.name)
    return 0


def main() -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="the rate-limit service alone, three setups")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of load first (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    ap.add_argument(
        "--setups", nargs="+", type=parse_setup, default=list(SETUPS),
        help="CLIENT:PROCESSES[:LOADERS] each (default h2:1 h2:2 grpc:1)",
    )  # fmt: skip
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tw-rls-") as tmp:
        result = rls_phase(Path(tmp), a.seconds, tuple(a.setups), a.warmup)
    result["load_average"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if a.out is not None:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
