"""The batch kill drill (issue 41's target: 0 lines lost or run twice with a runner, a filter
server and Redis each killed once mid-job): one 10,000-line job with short answers through
`tokenweir up` on the example mesh (its emulated chat pool, time-scaled fast), the batch runner,
a filter server and Redis each killed with SIGKILL once while lines are in flight (`up` starts
each again); the job is run to its end and counted:

- ``lost``: input lines whose ``custom_id`` is in neither the output nor the error file;
- ``duplicated``: ``custom_id`` s more than once in the output files;
- ``run_twice``: backend completions beyond one per line, from the emulators' own counters
  (``sglang:num_requests_total``, finished requests; aborted ones are not counted there) —
  the drill sends nothing else to the pool;
- the duration, and the gateway's idempotency outcomes (takeovers, aborts) as its filter
  servers report them (a killed filter server's counters die with it).

    python bench/batch_kill_drill.py --out bench/results/batch_kill_drill.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import yaml
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_valleys import KEY, lines, policy_text, stop_up  # noqa: E402

EP = "/v1/chat/completions"


def drill_policy(ns: argparse.Namespace) -> tuple[str, int, dict[str, int]]:
    """The valleys bench's policy (the example mesh on free ports), its chat pool time-scaled."""
    text, gw, ports = policy_text(ns.profile, ns.fill)
    doc = yaml.safe_load(text)
    doc["pools"]["chat"]["emulated"]["time_scale"] = ns.time_scale
    doc["batch"]["runner"]["claim_idle"] = f"{ns.claim_idle}s"
    # a shared 2-core box: the example's tight ext_proc message timeout, missed under load, would
    # lose answers on their way back (each a rerun) for reasons no kill caused
    doc["filters"]["message_timeout"] = f"{ns.message_timeout}s"
    if ns.inflight_ttl is not None:  # (the code before leases needed a short one to finish)
        doc.setdefault("idempotency", {})["inflight_ttl"] = f"{ns.inflight_ttl}s"
    return yaml.safe_dump(doc, sort_keys=False), gw, ports


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def finished(banner: str, pool: str) -> int:
    """Requests the pool's emulated replicas finished (aborts excluded)."""
    total = 0
    for url in re.findall(rf"emulator +{re.escape(pool)}#\d+ \S+ \(metrics (\S+)\)", banner):
        text = scrape(url)
        total += sum(
            int(float(v))
            for v in re.findall(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.M)
        )
    return total


def idempotency(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        text = scrape(f"http://127.0.0.1:{port}/metrics")
        for outcome, v in re.findall(
            r'^tokenweir_filters_idempotency_total\{[^}]*outcome="([a-z_]+)"[^}]*\} (\S+)$',
            text,
            re.M,
        ):
            out[outcome] = out.get(outcome, 0.0) + float(v)
    return out


def pid_of(banner: str, pattern: str) -> int:
    m = re.search(pattern, banner)
    if m is None:
        raise RuntimeError(f"{pattern!r} not in the banner:\n{banner}")
    return int(m.group(1))


def redis_pid(banner: str) -> int:
    """The pid of `up`'s redis-server (its banner names the port, not the pid)."""
    m = re.search(r"redis +redis://\S+@127\.0\.0\.1:(\d+)/0", banner)
    assert m is not None, banner
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    for row in ps.stdout.splitlines():
        if "redis-server" in row and row.rstrip().endswith(f"127.0.0.1:{m.group(1)}"):
            return int(row.split()[0])
    raise RuntimeError(f"no redis-server on port {m.group(1)}")


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    text, gw, ports = drill_policy(ns)
    run_dir = Path(ns.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "mesh.yaml").write_text(text)
    tokenweir = Path(sys.executable).parent / "tokenweir"
    argv = [str(tokenweir), "--log-level", "warning", "up", "--no-prometheus",
            "-c", str(run_dir / "mesh.yaml"), "--run-dir", str(run_dir / "up")]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert up.stdout is not None
    banner = ""
    try:
        for line in up.stdout:
            banner += line
            if "tokenweir up: ready" in line:
                break
        else:
            raise RuntimeError(f"up ended before ready:\n{banner}")
        client = OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key=KEY, max_retries=5)
        rows = lines(ns.lines, ns.tokens)
        data = b"\n".join(json.dumps(r).encode() for r in rows) + b"\n"
        before = finished(banner, "chat")
        f = client.files.create(file=("drill.jsonl", io.BytesIO(data)), purpose="batch")
        started = time.monotonic()
        b = client.batches.create(input_file_id=f.id, endpoint=EP, completion_window="24h")
        kills = [
            ("runner", ns.lines * 2 // 10, lambda: pid_of(banner, r"batch runner#0 .* pid (\d+)")),
            ("filter server", ns.lines * 45 // 100,
             lambda: pid_of(banner, r"filters +grpc://\S+ .*pid (\d+)")),
            ("redis", ns.lines * 7 // 10, lambda: redis_pid(banner)),
        ]  # fmt: skip
        killed: list[dict[str, Any]] = []
        idem: Counter[str] = Counter()
        job: Any = None
        while time.monotonic() - started < ns.timeout:
            try:
                job = client.batches.retrieve(b.id)
            except openai.APIError:  # a part restarting: poll again
                time.sleep(0.2)
                continue
            done = job.request_counts.completed + job.request_counts.failed
            if kills and done >= kills[0][1]:
                name, _, find = kills.pop(0)
                if name == "filter server":
                    idem.update(idempotency(ports["fsm"]))  # its counters die with it
                pid = find()
                kill(pid)
                killed.append({"part": name, "pid": pid, "at_lines": done,
                               "at_s": round(time.monotonic() - started, 2)})  # fmt: skip
                print(f"killed {name} (pid {pid}) at {done} lines", flush=True)
            if job.status in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(0.25)
        duration = time.monotonic() - started
        idem.update(idempotency(ports["fsm"]))
        time.sleep(1.0)  # the emulator counts a request after its last byte
        ran = finished(banner, "chat") - before
        got: Counter[str] = Counter()
        errors: list[Any] = []
        for fid in (job.output_file_id, job.error_file_id):
            if fid:
                for raw in client.files.content(fid).text.splitlines():
                    row = json.loads(raw)
                    got[row["custom_id"]] += 1
                    if row.get("error") or (row.get("response") or {}).get("status_code") != 200:
                        errors.append(row.get("error") or row["response"]["status_code"])
        want = {r["custom_id"] for r in rows}
        return {
            "setup": {k: v for k, v in vars(ns).items() if k != "out"},
            "status": job.status,
            "request_counts": job.request_counts.model_dump(),
            "duration_s": round(duration, 1),
            "lines_per_s": round(ns.lines / duration, 1),
            "killed": killed,
            "lost": len(want - set(got)),
            "duplicated": sum(1 for v in got.values() if v > 1),
            "failed_lines": len(errors),
            "backend_completions": ran,
            "run_twice": max(0, ran - ns.lines),
            "idempotency_outcomes": dict(idem),
        }
    finally:
        stop_up(up)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=10000)
    p.add_argument("--tokens", type=int, default=8, help="max_tokens of each line")
    p.add_argument("--time-scale", type=float, default=0.05, help="the chat pool's emulators")
    p.add_argument("--profile", default="seed-2k")
    p.add_argument("--fill", type=float, default=0.9)
    p.add_argument("--claim-idle", type=float, default=3.0)
    p.add_argument("--message-timeout", type=float, default=2.0, help="filters.message_timeout")
    p.add_argument(
        "--inflight-ttl",
        type=float,
        help="idempotency.inflight_ttl (default: unset; the baseline run of code before leases used 3)",
    )
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--run-dir", default="/tmp/tokenweir-batch-kill-drill")
    p.add_argument("--out", type=Path)
    ns = p.parse_args()
    result = run(ns)
    text = json.dumps(result, indent=2)
    print(text)
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
