"""What the gateway adds to one request as its prompt grows: 3 KB, 71 KB and 300 KB bodies.

``tokenweir up`` on the example policy (``examples/mesh.yaml``: identity, tokens, prefix, lane,
usage, token quotas in Redis; its ports patched to free ones, one emulated replica, quotas that
never bind) and the same emulator replica straight, one request at a time on an idle machine,
direct and through the gateway interleaved. Every prompt is new (its first words are random), so
no request hits the emulator's prefix cache and both paths pay the same prefill. A non-streamed
chat completion with ``max_tokens: 1``; the time is the client's, from send to the whole answer.
Added latency = median through the gateway − median direct, per size (and the median of the
per-pair differences). ``--baseline-src DIR`` (e.g. a ``git archive`` of older code) runs a
second gateway from that code on its own emulator in the same run, interleaved with the first.

``.venv/bin/python bench/large_prompts.py [--requests 40] [--sizes 3 71 300] [--tag T]``:
JSON in ``bench/results/large_prompts[-T].json`` and a table on stdout (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.children import Child, checkout, wait_child_line, wait_child_port  # noqa: E402
from runtime.ports import free_port  # noqa: E402

KEY = "tw-demo-pro-key"
# prompt text: this repository's own docs (prose, tables, code blocks), from a random offset
CORPUS = "\n".join(f.read_text(errors="replace") for f in sorted((ROOT / "docs").glob("*.md")))


def policy(gateway: int) -> tuple[dict[str, Any], int]:
    """The example policy on free ports, one emulated replica; (policy, the replica's port)."""
    p: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "mesh.yaml").read_text())
    p["control_plane"].update(xds=f"127.0.0.1:{free_port()}", metrics=f"127.0.0.1:{free_port()}")
    p["ratelimit"].update(address=f"127.0.0.1:{free_port()}", metrics_port=free_port())
    p["filters"].update(address=f"127.0.0.1:{free_port()}", metrics_port=free_port())
    p["filters"]["message_timeout"] = "2s"  # the 300 KB body's parse must not race the timer
    emu = free_port()
    chat = p["pools"]["chat"]
    chat["emulated"].update(replicas=1, base_port=emu, time_scale=0.01)
    chat["retries"] = {"enabled": False}
    for name, pool in p["pools"].items():  # the fallback pool too: two arms run side by side
        if name != "chat" and pool.get("emulated") is not None:
            pool["emulated"].update(replicas=1, base_port=free_port())
    for key in ("services", "sidecars", "batch"):  # the batch API is a service too
        p.pop(key, None)
    p["gateways"]["edge"]["listen"] = f"127.0.0.1:{gateway}"
    p["gateways"]["edge"]["routes"] = [
        r for r in p["gateways"]["edge"]["routes"] if r.get("service") is None
    ]
    huge = {"burst": 10**9, "refill_per_second": 10**8}
    p["tiers"]["pro"]["quotas"] = {"tokens": huge}
    return p, emu


class Arm:
    def __init__(self, name: str, run: Path, src: Path | None) -> None:
        self.name, self.run, self.src = name, run / name, src
        self.run.mkdir(parents=True)
        self.port = free_port()
        self.child: Child | None = None
        self.emulator = 0

    async def start(self) -> None:
        pol, self.emulator = policy(self.port)
        path = self.run / "policy.yaml"
        path.write_text(yaml.safe_dump(pol, sort_keys=False))
        argv = [
            str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "--no-prometheus", "-c", str(path), "--run-dir", str(self.run / "up"),
        ]  # fmt: skip
        env, cwd = checkout(self.src)
        self.child = Child(f"up-{self.name}", argv, self.run / "up.log", env=env, cwd=cwd)
        self.child.start()
        await wait_child_port("127.0.0.1", self.port, self.child, timeout=120)
        await wait_child_line(self.child, "tokenweir up: ready", timeout=90)

    async def aclose(self) -> None:
        if self.child is not None:
            await self.child.aclose(5.0)


def body(kb: int, rng: random.Random) -> bytes:
    """A chat body of about ``kb`` KB whose prompt starts with random words (no cache hit)."""
    size = kb * 1000 - 120
    start = rng.randrange(0, len(CORPUS) - size)
    text = f"request {rng.getrandbits(64):x}: " + CORPUS[start : start + size]
    msg = {"role": "user", "content": text}
    return json.dumps({"model": "llama-3.1-8b", "messages": [msg], "max_tokens": 1}).encode()


async def timed(http: aiohttp.ClientSession, url: str, data: bytes, gateway: bool) -> float:
    headers = {"content-type": "application/json"}
    if gateway:
        headers["authorization"] = f"Bearer {KEY}"
    t0 = time.perf_counter()
    async with http.post(url, data=data, headers=headers) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
    return time.perf_counter() - t0


async def measure(arms: list[Arm], sizes: list[int], n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for arm in arms:  # warm both paths (connections, the filter server's first parse)
            for kb in sizes:
                for gw in (False, True):
                    await timed(http, _url(arm, gw), body(kb, rng), gw)
        for kb in sizes:
            res: dict[str, dict[str, list[float]]] = {
                a.name: {"direct": [], "gateway": []} for a in arms
            }
            for _ in range(n):
                for arm in arms:
                    for gw in rng.sample([False, True], 2):  # the order varies
                        t = await timed(http, _url(arm, gw), body(kb, rng), gw)
                        res[arm.name]["gateway" if gw else "direct"].append(t)
            out[f"{kb}KB"] = {name: _summary(r) for name, r in res.items()}
    return out


def _url(arm: Arm, gateway: bool) -> str:
    port = arm.port if gateway else arm.emulator
    return f"http://127.0.0.1:{port}/v1/chat/completions"


def _summary(r: dict[str, list[float]]) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float:
        v = sorted(values)
        return round(1000 * v[min(len(v) - 1, int(q * len(v)))], 2)

    pairs = [g - d for g, d in zip(r["gateway"], r["direct"], strict=True)]
    return {
        "n": len(pairs),
        "direct_ms": {"p50": ms(r["direct"], 0.5), "p99": ms(r["direct"], 0.99)},
        "gateway_ms": {"p50": ms(r["gateway"], 0.5), "p99": ms(r["gateway"], 0.99)},
        "added_ms_p50": round(ms(r["gateway"], 0.5) - ms(r["direct"], 0.5), 2),
        "added_ms_pair_median": round(1000 * statistics.median(pairs), 2),
    }


async def main_async(a: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tw-large-") as tmp:
        arms = [Arm("tokenweir", Path(tmp), None)]
        if a.baseline_src:
            arms.append(Arm("baseline", Path(tmp), Path(a.baseline_src)))
        try:
            await asyncio.gather(*(arm.start() for arm in arms))
            res = await measure(arms, a.sizes, a.requests, a.seed)
        finally:
            await asyncio.gather(*(arm.aclose() for arm in arms))
    print("| body | arm | direct p50 / p99 ms | gateway p50 / p99 ms | added p50 | paired median |")
    print("|---|---|---|---|---|---|")
    for size, per in res.items():
        for name, s in per.items():
            print(
                f"| {size} | {name} | {s['direct_ms']['p50']} / {s['direct_ms']['p99']} | "
                f"{s['gateway_ms']['p50']} / {s['gateway_ms']['p99']} | {s['added_ms_p50']} | "
                f"{s['added_ms_pair_median']} |"
            )
    out = {"config": vars(a), "results": res}
    name = "large_prompts" + (f"-{a.tag}" if a.tag else "")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{name}.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=40, help="per size, arm and path")
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 71, 300], help="body KB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline-src", help="a checkout whose code a second gateway runs")
    ap.add_argument("--tag", help="results as large_prompts-TAG.json")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    try:
        import uvloop

        return uvloop.run(main_async(ap.parse_args()))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
