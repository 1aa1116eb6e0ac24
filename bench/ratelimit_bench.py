"""Rate-limit service benchmark, side by side in one run (results: bench/results/ratelimit_bench.json).

* Redis ceiling: redis-benchmark running reserve.lua (EVALSHA, 3 keys) unpipelined and pipelined.
* gRPC direct: bench/ratelimit_load.py (closed loop, concurrency 1/50/200) against a gRPC floor
  (answers OK, decides nothing), the naive service (bench/ratelimit_naive.py), ours with 1 process
  ours with grpc.aio (``--transport grpc``), ours with the built-in HTTP/2 transport (default) in
  1 process and in 2 processes sharing the port.
* Through Envoy: k6 (closed loop, same concurrencies) → Envoy (1 worker, direct_response route, the
  ratelimit filter from controlplane/translate/ratelimit.py) with the filter off, naive, ours 1 and 2.

CPU µs per decision = CPU seconds of the service processes / decisions. Every decision is a reserve
of 50–250 tokens for one of 100 tenants with a token bucket and a monthly budget (a Lua call with a
record, two counters). Usage: ``.venv/bin/python bench/ratelimit_bench.py [--seconds 4]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from policy import load_policy  # noqa: E402
from ratelimit_service.store import load_script  # noqa: E402
from tests.helpers import ChildProcess, free_port, redis_server, wait_for_port  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from ratelimit_envoy import envoy_config, k6_load  # noqa: E402

BIN = Path(sys.executable).parent
CONCURRENCY = (1, 50, 200)
OPEN_RATE = 1000  # requests/s offered in the open-loop run (at most 200 in flight)


def policy_text(port: int) -> str:
    tenants = "".join(f"  bench-{i}: {{tier: t}}\n" for i in range(100))
    return (
        f"version: 1\nratelimit: {{address: 127.0.0.1:{port}, timeout: 100ms}}\n"
        "tiers: {t: {quotas: {tokens: {burst: 900000000, refill_per_second: 1000000, "
        "per_month: 999999999}}}}\ntenants:\n" + tenants
    )


def service_p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """Upper bound of the bucket holding the 99th percentile of the decisions in between."""
    diff = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = diff.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in sorted(diff):
        if diff[le] >= 0.99 * total:
            return le * 1000
    return None


def cpu_seconds(pid: int) -> float:
    total = 0.0
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        pids += [int(x) for x in task.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def redis_ceiling(port: int) -> dict[str, float]:
    sha = hashlib.sha1(load_script("reserve").encode()).hexdigest()
    subprocess.run(
        ["redis-cli", "-p", str(port), "SCRIPT", "LOAD", load_script("reserve")],
        check=True,
        capture_output=True,
    )
    now = int(time.time() * 1e6)
    args = [
        "EVALSHA",
        sha,
        "3",
        "tw:{b__rand_int__}:r:x",
        "tw:{b__rand_int__}:b:tokens",
        "tw:{b__rand_int__}:w:tokens:month:1",
        str(now),
        "600000",
        "1",
        "b",
        "100",
        "900000000",
        "1000000.0",
        "0",
        "2",
        "w",
        "100",
        "999999999",
        "0.0",
        str(now + 10**12),
        "2",
    ]
    out = {}
    for pipeline in (1, 16):
        res = subprocess.run(
            [
                "redis-benchmark",
                "-p",
                str(port),
                "-n",
                "100000",
                "-c",
                "50",
                "-r",
                "100",
                "-P",
                str(pipeline),
                "-q",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rps = [
            float(tok)
            for line in res.replace("\r", "\n").splitlines()
            if "requests per second" in line
            for tok in line.split()
            if tok.replace(".", "").isdigit()
        ]
        out[f"pipeline_{pipeline}"] = rps[-1] if rps else 0.0
    return out


class Service:
    def __init__(self, kind: str, policy: Path, redis_url: str, port: int, tmp: Path) -> None:
        env = {"PYTHONPATH": str(ROOT)}
        if kind in ("naive", "floor"):
            argv = [
                sys.executable,
                str(ROOT / "bench" / "ratelimit_naive.py"),
                "--policy",
                str(policy),
                "--redis-url",
                redis_url,
                "--listen",
                f"127.0.0.1:{port}",
            ]
            argv += ["--floor"] if kind == "floor" else []
        else:
            argv = [
                sys.executable,
                "-m",
                "ratelimit_service",
                "--policy",
                str(policy),
                "--redis-url",
                redis_url,
                "--listen",
                f"127.0.0.1:{port}",
                "--processes",
                kind[-1],
                "--log-level",
                "warning",
                "--transport",
                "grpc" if "grpc" in kind else "h2",
            ]
        self.metrics_ports: list[int] = []
        if kind.startswith("ours"):
            base = free_port()
            argv += ["--metrics-port", str(base)]
            self.metrics_ports = [base + i for i in range(int(kind[-1]))]
        self.child = ChildProcess(argv, log=tmp / f"rls-{kind}.log", env=env)
        wait_for_port(port, timeout=20)
        for mport in self.metrics_ports:  # every worker process is up (each serves /metrics)
            wait_for_port(mport, timeout=20)
        time.sleep(1.0 if len(self.metrics_ports) > 1 else 0.3)

    def hist(self) -> dict[float, float]:
        """Cumulative decision-latency buckets inside the service (all workers)."""
        out: dict[float, float] = {}
        for mport in self.metrics_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            for line in text.splitlines():
                if line.startswith("tokenweir_ratelimit_decision_seconds_bucket"):
                    le = line.split('le="')[1].split('"')[0]
                    key = float("inf") if le == "+Inf" else float(le)
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def cpu(self) -> float:
        return cpu_seconds(self.child.proc.pid)

    def close(self) -> None:
        self.child.close()


def grpc_load(port: int, concurrency: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ratelimit_load.py"),
            "--target",
            f"127.0.0.1:{port}",
            "--concurrency",
            str(concurrency),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ratelimit_bench.json")
    a = ap.parse_args()
    results: dict[str, Any] = {
        "cores": os.cpu_count(),
        "seconds": a.seconds,
        "load1_start": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="tw-rlbench-") as tmpd, redis_server() as rport:
        tmp = Path(tmpd)
        results["redis_ceiling"] = redis_ceiling(rport)
        url = f"redis://127.0.0.1:{rport}/0"
        for kind in ("floor", "naive", "ours-grpc-1", "ours-1", "ours-2"):
            port = free_port()
            policy = tmp / f"policy-{kind}.yaml"
            policy.write_text(policy_text(port))
            svc = Service(kind, policy, url, port, tmp)
            try:
                grpc_load(port, 50, 1.0)  # warm up: connections, script cache, quota cache
                for c in CONCURRENCY:
                    cpu0, h0 = svc.cpu(), svc.hist() if svc.metrics_ports else {}
                    r = grpc_load(port, c, a.seconds)
                    r["cpu_us_per_decision"] = round(
                        (svc.cpu() - cpu0) / max(1, r["calls"]) * 1e6, 1
                    )
                    if svc.metrics_ports:
                        r["service_p99_ms_at_most"] = service_p99_ms(h0, svc.hist())
                    results.setdefault("grpc", {}).setdefault(kind, {})[str(c)] = r
                    print("grpc", kind, c, r, flush=True)
                for limited in (False, True) if kind == "floor" else (True,):
                    listen, admin = free_port(), free_port()
                    cfg = tmp / "envoy.json"
                    cfg.write_text(
                        json.dumps(envoy_config(load_policy(policy), listen, admin, port, limited))
                    )
                    envoy = ChildProcess(
                        [
                            str(BIN / "envoy"),
                            "-c",
                            str(cfg),
                            "--base-id",
                            str(30000 + os.getpid() % 1000),
                            "--concurrency",
                            "1",
                            "-l",
                            "error",
                        ],
                        log=tmp / "envoy.log",
                    )
                    try:
                        wait_for_port(listen, timeout=30)
                        name = kind if limited else "no-ratelimit"
                        url_v1 = f"http://127.0.0.1:{listen}/v1/chat/completions"
                        k6_load(f"http://127.0.0.1:{listen}/v1/chat/completions", 50, 1.0, tmp)
                        for c in CONCURRENCY:
                            cpu0, h0 = svc.cpu(), svc.hist() if svc.metrics_ports else {}
                            r = k6_load(
                                f"http://127.0.0.1:{listen}/v1/chat/completions", c, a.seconds, tmp
                            )
                            if limited:
                                r["cpu_us_per_decision"] = round(
                                    (svc.cpu() - cpu0) / max(1, r["calls"]) * 1e6, 1
                                )
                            if svc.metrics_ports:
                                r["service_p99_ms_at_most"] = service_p99_ms(h0, svc.hist())
                            results.setdefault("envoy", {}).setdefault(name, {})[str(c)] = r
                            print("envoy", name, c, r, flush=True)
                        r = k6_load(url_v1, 0, a.seconds, tmp, rate=OPEN_RATE)
                        results.setdefault("envoy_open", {})[name] = r
                        print("envoy open loop", OPEN_RATE, "/s", name, r, flush=True)
                    finally:
                        envoy.close()
            finally:
                svc.close()
    results["load1_end"] = os.getloadavg()[0]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results["redis_ceiling"]))


if __name__ == "__main__":
    main()
