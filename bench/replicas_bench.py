"""Requests/s of the full governance path with 1, 2 and 3 gateway replicas, and the control
plane's CPU per Envoy, from `tokenweir up --replicas` (one run per arm, on this machine).

A gateway replica is an Envoy plus its own filter server (as in a Kubernetes gateway pod);
one rate-limit service, Redis and two control planes serve them all. The backend is an Envoy
answering a canned completion. k6 (16 VUs, keep-alive: the kernel spreads the 16 connections
over the Envoys sharing the port) drives `--seconds` per arm. Then `--edits` policy changes that
touch every Envoy's clusters are made 2 s apart; the control planes' CPU over that window, less
their idle rate, divided by edits and Envoys, is their cost per Envoy per change.

``nice -n 5 .venv/bin/python bench/replicas_bench.py [--seconds 10] [--edits 5]`` →
bench/results/replicas_bench.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.filters_bench import KEY, canned_bootstrap, cpu_seconds, k6  # noqa: E402
from tests.helpers import ChildProcess, free_port, free_port_block, wait_for_port  # noqa: E402
from tokenweir.envoy_launcher import envoy_binary  # noqa: E402

_PID = re.compile(r"(?P<name>[a-z][\w-]*#\d+|ratelimit|filters|edge):?\s.*\bpid (?P<pid>\d+)")


def policy(gw: int, xds: int, metrics: int, rl: int, fs: int, canned: int, cap: int) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}, debounce: 50ms}}
ratelimit: {{address: 127.0.0.1:{rl}, timeout: 1s}}
filters: {{address: 127.0.0.1:{fs}, message_timeout: 1s}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:{canned}]
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
    circuit_breakers: {{interactive: {{max_requests: {cap}}}, batch: {{max_requests: {cap}}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: full
        match: {{prefix: /v1/}}
        pool: chat
        rate_limit: {{enabled: true}}
        filters: {{plugins: [identity, tokens, prefix, lane, usage]}}
tiers:
  big: {{max_tokens: 4096, quotas: {{tokens: {{burst: 1000000000, refill_per_second: 1000000000}}}}}}
tenants:
  bench: {{tier: big, api_keys: [{KEY}]}}
"""


def arm(n: int, seconds: int, edits: int, vus: int, tmp: Path, canned: int) -> dict[str, Any]:
    gw, xds, metrics, rl, fs = (free_port_block(4) for _ in range(5))
    path = tmp / f"mesh-{n}.yaml"
    path.write_text(policy(gw, xds, metrics, rl, fs, canned, 256))
    argv = [str(ROOT / ".venv/bin/tokenweir"), "up", "-c", str(path), "--run-dir", str(tmp / f"run-{n}"),
            "--state-dir", str(tmp / f"state-{n}"), "--fresh", "--drain-timeout", "1",
            "--replicas", f"gateway={n},filters={n},ratelimit=1,controlplane=2"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    pids: dict[str, int] = {}
    try:
        for line in proc.stdout:
            if m := _PID.search(line.replace("control plane#", "controlplane#")):
                pids[m.group("name")] = int(m.group("pid"))
            if "tokenweir up: ready" in line:
                break
        else:
            raise RuntimeError("tokenweir up did not start")
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        k6(url, 2, vus, tmp)  # warm-up
        load = k6(url, seconds, vus, tmp, pids)
        planes = {k: v for k, v in pids.items() if k.startswith("controlplane")}
        idle0, t0 = sum(cpu_seconds(planes).values()), time.monotonic()
        time.sleep(4.0)
        idle_rate = (sum(cpu_seconds(planes).values()) - idle0) / (time.monotonic() - t0)
        before, t1 = sum(cpu_seconds(planes).values()), time.monotonic()
        for i in range(edits):
            path.write_text(policy(gw, xds, metrics, rl, fs, canned, 300 + i))
            time.sleep(2.0)
        spent = sum(cpu_seconds(planes).values()) - before - idle_rate * (time.monotonic() - t1)
        role = {"envoy": 0.0, "filters": 0.0, "ratelimit": 0.0}
        for key, value in load.items():
            if key.startswith("cpu_ms_per_req_"):
                name = key.removeprefix("cpu_ms_per_req_")
                kind = "envoy" if name.startswith("edge") else name.split("#")[0]
                if kind in role:
                    role[kind] += value
        return {
            "gateways": n,
            "rps": round(load["rps"]),
            "p50_ms": round(load["p50_ms"], 1),
            "p99_ms": round(load["p99_ms"], 1),
            "failed": load["failed"],
            "cpu_ms_per_req": {k: round(v, 3) for k, v in role.items()},
            "cp_idle_cpu_ms_per_s_per_envoy": round(idle_rate * 1000 / n, 3),
            "cp_cpu_ms_per_change_per_envoy": round(max(spent, 0.0) * 1000 / edits / n, 2),
        }
    finally:
        proc.send_signal(2)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--edits", type=int, default=5)
    p.add_argument("--vus", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/replicas_bench.json")
    ns = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tw-replicas-") as tmp_name:
        tmp = Path(tmp_name)
        canned = free_port()
        boot = tmp / "canned.json"
        boot.write_text(json.dumps(canned_bootstrap(canned)))
        backend = ChildProcess(
            [
                str(envoy_binary()),
                "-c",
                str(boot),
                "--base-id",
                str(free_port()),
                "--concurrency",
                "1",
            ],
            log=tmp / "canned.log",
        )
        try:
            wait_for_port(canned)
            for n in (1, 2, 3):
                rows.append(arm(n, ns.seconds, ns.edits, ns.vus, tmp, canned))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            backend.close()
    load = subprocess.run(["cat", "/proc/loadavg"], capture_output=True, text=True).stdout.strip()
    result = {"load_average_after": load, "seconds": ns.seconds, "vus": ns.vus, "rows": rows}
    ns.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        "| gateways | req/s | p50 / p99 ms | CPU ms/req Envoy, filters, RLS | CP idle ms/s per Envoy | CP ms per change per Envoy |"
    )
    for r in rows:
        c = r["cpu_ms_per_req"]
        print(
            f"| {r['gateways']} | {r['rps']} | {r['p50_ms']} / {r['p99_ms']} | {c['envoy']}, {c['filters']}, {c['ratelimit']} | {r['cp_idle_cpu_ms_per_s_per_envoy']} | {r['cp_cpu_ms_per_change_per_envoy']} |"
        )


if __name__ == "__main__":
    main()
