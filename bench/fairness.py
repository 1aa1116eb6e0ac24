"""Fairness in tokens (issue 36 item 4): two tenants in one saturated lane, through the whole
mesh (`tokenweir up`, two filter servers side by side, one emulated replica, a capacity of 4).

Tenant ``light`` asks for long answers (``--long`` tokens), tenant ``heavy`` for short ones
(``--short``); each keeps ``--clients`` requests outstanding for ``--seconds``, so the lane's
queue always holds both. Two scenarios:

- ``weighted``: ``heavy``'s tier weighs 3, ``light``'s 1: its settled tokens should be 3x;
- ``equal``: both weigh 1: Jain's index of their settled tokens should be near 1.

Settled tokens are what the responses' ``usage`` says (prompt + completion), counted for the
answers that ended in the window after ``--warmup``. Request-count fairness (main before
this change) gives the long-answer tenant ``long/short`` times the tokens per weight instead.

    .venv/bin/python bench/fairness.py                       # both scenarios, 60 s each
    .venv/bin/python bench/fairness.py --seconds 20 --scenarios weighted
    # main's code beside this one in one run
    git archive main | tar -x -C /tmp/tw-main
    .venv/bin/python bench/fairness.py --baseline-src /tmp/tw-main

Prints one row per arm and scenario; ``--out`` writes them as markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from runtime.children import checkout  # noqa: E402
from runtime.ports import free_port  # noqa: E402

MODEL = "llama-3.1-8b"
KEYS = {"light": "tw-fair-light", "heavy": "tw-fair-heavy"}


def policy_text(ports: dict[str, int], weights: dict[str, int], capacity: int = 4) -> str:
    p = ports
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{p["xds"]}, metrics: 127.0.0.1:{p["cp_metrics"]}}}
filters: {{address: 127.0.0.1:{p["filters"]}, metrics_port: {p["metrics"]}, message_timeout: 60s}}
ratelimit: {{address: 127.0.0.1:{p["rls"]}, metrics_port: {p["rls_metrics"]}}}
pools:
  chat:
    models: [{MODEL}]
    emulated: {{replicas: 1, profile: llama-3.1-8b-h100, base_port: {p["backend"]}}}
    capacity: {{max_running_requests: {capacity}}}
    retries: {{enabled: false}}
gateways:
  edge: {{listen: 127.0.0.1:{p["gateway"]}, routes: [{{name: chat, pool: chat,
         match: {{prefix: /v1/}}, filters: {{plugins: [identity, lane, admission, usage]}}}}]}}
admission:
  interactive: {{ttft_budget: 2s}}
  batch: {{ttft_budget: 120s, max_wait: 60s, max_queue: 512, max_queue_per_tenant: 256}}
  tier_weights: {{light: {weights["light"]}, heavy: {weights["heavy"]}}}
tiers:
  light: {{lane: batch, allowed_lanes: [batch], max_tokens: 4096}}
  heavy: {{lane: batch, allowed_lanes: [batch], max_tokens: 4096}}
tenants:
  light: {{tier: light, api_keys: [{KEYS["light"]}]}}
  heavy: {{tier: heavy, api_keys: [{KEYS["heavy"]}]}}
"""


def free_ports() -> dict[str, int]:
    names = ("xds", "cp_metrics", "filters", "rls", "rls_metrics", "gateway", "backend")
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        p = free_port()
        if p not in ports.values():
            ports[names[len(ports)]] = p
    metrics = free_port()  # the second filter server's metrics port is this + 1
    while metrics in ports.values() or metrics + 1 in ports.values():
        metrics = free_port()
    ports["metrics"] = metrics
    return ports


@dataclass
class Mesh:
    proc: subprocess.Popen[str]
    ports: dict[str, int]
    log: Path
    out: TextIO

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(40)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self.out.close()


def start_mesh(
    run_dir: Path, weights: dict[str, int], src: Path | None = None, timeout: float = 120.0
) -> Mesh:
    """``tokenweir up --replicas filters=2`` on the scenario's policy (``src``: another
    checkout's code, for a before/after run)."""
    ports = free_ports()
    run_dir.mkdir(parents=True, exist_ok=True)
    policy = run_dir / "mesh.yaml"
    policy.write_text(policy_text(ports, weights))
    env_extra, cwd = checkout(src)
    env = {**os.environ, **env_extra}
    tokenweir = Path(sys.executable).parent / "tokenweir"
    argv = [str(tokenweir), "up", "-c", str(policy), "--run-dir", str(run_dir / "run")]
    argv += ["--replicas", "filters=2", "--no-prometheus", "--fresh"]
    log = run_dir / "up.log"
    out = log.open("w")
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=cwd or ROOT, env=env
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "tokenweir up: ready" in log.read_text():
            return Mesh(proc, ports, log, out)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    mesh = Mesh(proc, ports, log, out)
    mesh.stop()
    raise RuntimeError(f"tokenweir up did not start:\n{log.read_text()[-3000:]}")


async def drive(
    url: str, lengths: dict[str, int], clients: int, seconds: float, warmup: float
) -> dict[str, float]:
    """Each tenant keeps ``clients`` requests outstanding; the settled tokens (the answers'
    usage) of the answers that ended between ``warmup`` and ``seconds``."""
    served = dict.fromkeys(lengths, 0.0)
    t0 = time.monotonic()
    end = t0 + seconds
    timeout = aiohttp.ClientTimeout(total=max(120.0, seconds * 2))

    async def client(http: aiohttp.ClientSession, tenant: str) -> None:
        body = json.dumps({
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{tenant}: tell me a story"}],
            "max_tokens": lengths[tenant],
        })  # fmt: skip
        headers = {"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"}
        while time.monotonic() < end:
            async with http.post(url, data=body, headers=headers) as r:
                data = await r.read()
            now = time.monotonic()
            if r.status != 200:
                await asyncio.sleep(0.2)
                continue
            usage = json.loads(data).get("usage") or {}
            if t0 + warmup <= now <= end:
                served[tenant] += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)

    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(client(http, t) for t in lengths for _ in range(clients)))
    return served


def filter_metric(port: int, name: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return None
    m = re.search(
        rf"^{re.escape(name)}\{{[^}}]*lane=\"batch\"[^}}]*\}} (\S+)$", text.decode(), re.M
    )
    return float(m.group(1)) if m else None


def jain(xs: list[float]) -> float:
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares else 1.0


SCENARIOS = {"weighted": {"light": 1, "heavy": 3}, "equal": {"light": 1, "heavy": 1}}


def run_scenario(
    name: str, work: Path, *, src: Path | None, seconds: float, warmup: float, clients: int,
    long: int, short: int,
) -> dict[str, object]:  # fmt: skip
    weights = SCENARIOS[name]
    mesh = start_mesh(work, weights, src)
    try:
        url = f"http://127.0.0.1:{mesh.ports['gateway']}/v1/chat/completions"
        lengths = {"light": long, "heavy": short}
        served = asyncio.run(drive(url, lengths, clients, seconds, warmup))
        gauges = [
            filter_metric(mesh.ports["metrics"] + i, "tokenweir_admission_fairness_jain")
            for i in (0, 1)
        ]
    finally:
        mesh.stop()
    per_weight = [served[t] / weights[t] for t in ("light", "heavy")]
    return {
        "scenario": name,
        "weights": f"{weights['light']}:{weights['heavy']}",
        "light_tokens": round(served["light"]),
        "heavy_tokens": round(served["heavy"]),
        "heavy_over_light": round(served["heavy"] / served["light"], 3)
        if served["light"]
        else None,
        "jain_weighted": round(jain(per_weight), 4),
        "jain_gauges": gauges,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=6, help="requests outstanding per tenant")
    ap.add_argument("--long", type=int, default=200, help="the light tenant's max_tokens")
    ap.add_argument("--short", type=int, default=50, help="the heavy tenant's max_tokens")
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="another checkout (git archive main) run beside this one")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write the rows as markdown here")
    a = ap.parse_args()
    arms: list[tuple[str, Path | None]] = [("tokenweir", None)]
    if a.baseline_src is not None:
        arms.insert(0, ("baseline", a.baseline_src))
    rows = []
    with tempfile.TemporaryDirectory(prefix="tw-fairness-") as tmp:
        for scenario in a.scenarios:
            for arm, src in arms:
                row = run_scenario(
                    scenario, Path(tmp) / f"{arm}-{scenario}", src=src, seconds=a.seconds,
                    warmup=a.warmup, clients=a.clients, long=a.long, short=a.short,
                )  # fmt: skip
                row = {"arm": arm, **row}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.out is not None:
        cols = list(rows[0])
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
