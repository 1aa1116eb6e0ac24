"""The request body phase of routes whose plugins read the body after ``tokens`` (``collapse``,
``pd``, ``lora``), in one filter process's chain without network: CPU per request of
``Chain.request_body`` on chat bodies of 3, 71 and 300 KB (raw UTF-8, cut from this
repository's docs as ``bench/large_prompts.py`` builds them), for this tree and for another one
(``--baseline-src``, e.g. a ``git archive`` of the code before the body was decoded once per
request), each in its own child process, the arms alternating round by round.

``.venv/bin/python bench/body_once.py --baseline-src DIR [--rounds 4] [--repeat 15]``: a table
on stdout and ``bench/results/body_once.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

POOLS = """
version: 1
pools:
  chat:
    models: [m]
    endpoints: [10.0.0.1:30000, 10.0.0.2:30000]
    retries: {enabled: false}
  adapters:
    models: [m]
    endpoints: [10.2.0.1:30000, 10.2.0.2:30000]
    retries: {enabled: false}
    lora: {adapters: [sql]}
  split:
    models: [m]
    retries: {enabled: false}
    disaggregation:
      prefill: [{address: 10.1.0.1:30000, bootstrap_port: 9001}]
      decode: [10.1.0.3:30000]
"""
# route name: (pool, model, plugins after tokens)
ROUTES = {
    "collapse": ("chat", "m", ("collapse",)),
    "lora+collapse": ("adapters", "sql", ("lora", "collapse")),
    "pd+collapse": ("split", "m", ("pd", "collapse")),
}


def child(sizes: list[int], repeat: int) -> dict[str, dict[int, float]]:
    """In the child (``sys.path`` holds the tree under test): median CPU ms per route and size."""
    from prometheus_client import CollectorRegistry

    from filters.api import Context, RouteInfo
    from filters.chain import Chain
    from filters.plugins.collapse.hub import Hub
    from filters.plugins.collapse.plugin import CollapsePlugin
    from filters.plugins.lora.hub import LoraHub
    from filters.plugins.lora.plugin import LoraPlugin
    from filters.plugins.pd.hub import Flight, PdHub
    from filters.plugins.pd.plugin import PdPlugin
    from filters.plugins.tokens.plugin import TokensPlugin
    from filters.services import default_services
    from policy import load_policy

    class Sink(PdHub):
        def send_prefill(self, flight: Flight, path: str, body: bytes, pd: object) -> None:
            return None

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pools.yaml"
        path.write_text(POOLS)
        policy = load_policy(path)
    clock = time.monotonic
    services = default_services(policy, clock)
    object.__setattr__(services, "collapser", Hub(clock, address="127.0.0.1:9"))
    object.__setattr__(services, "pd", Sink(CollectorRegistry(), clock=clock))
    object.__setattr__(services, "lora", LoraHub(CollectorRegistry(), offline=True))
    kinds = {"collapse": CollapsePlugin, "lora": LoraPlugin, "pd": PdPlugin}
    corpus = "\n".join(f.read_text(errors="replace") for f in sorted((ROOT / "docs").glob("*.md")))
    rng = random.Random(7)
    out: dict[str, dict[int, float]] = {}

    async def run() -> None:
        for name, (pool, model, after) in ROUTES.items():
            chain = Chain(
                name, [TokensPlugin({}, services), *(kinds[k]({}, services) for k in after)]
            )
            route = RouteInfo(name=name, pool=pool, models=("m", "sql"))
            out[name] = {}
            for kb in sizes:
                times = []
                for _ in range(repeat):
                    start = rng.randrange(0, len(corpus) - kb * 1000)
                    text = f"{rng.random()} " + corpus[start : start + kb * 1000 - 150]
                    msgs = [{"role": "user", "content": text}]
                    body = json.dumps(
                        {"model": model, "messages": msgs, "max_tokens": 1, "temperature": 0},
                        ensure_ascii=False,
                    ).encode()
                    ctx = Context(route=route, started=clock(), path="/v1/chat/completions",
                                  method="POST", model=model)  # fmt: skip
                    t0 = time.process_time()
                    result = await chain.request_body(ctx, body)
                    times.append(time.process_time() - t0)
                    assert result.reply is None, result.reply
                    await chain.stream_end(ctx)
                out[name][kb] = statistics.median(times) * 1000

    asyncio.run(run())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-src", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 71, 300])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "body_once.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.sizes, a.repeat)))
        return
    arms = {"new": ROOT, "old": a.baseline_src.resolve()}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"new": [], "old": []}
    for r in range(a.rounds):
        for arm in ("new", "old") if r % 2 == 0 else ("old", "new"):
            env = {**os.environ, "PYTHONPATH": str(arms[arm])}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child",
                   "--repeat", str(a.repeat), "--sizes", *map(str, a.sizes),
                   "--baseline-src", "-"]  # fmt: skip
            done = subprocess.run(cmd, env=env, cwd=arms[arm], capture_output=True, check=True)
            runs[arm].append(json.loads(done.stdout))
    rows = []
    print("| route (tokens, then) | body | old ms | new ms | new/old |\n|---|---|---|---|---|")
    for name in ROUTES:
        for kb in a.sizes:
            old, new = (statistics.median(run[name][str(kb)] for run in runs[arm])
                        for arm in ("old", "new"))  # fmt: skip
            rows.append({"route": name, "kb": kb, "old_ms": round(old, 3),
                         "new_ms": round(new, 3), "ratio": round(new / old, 2)})  # fmt: skip
            print(f"| {name} | {kb} KB | {old:.3f} | {new:.3f} | {new / old:.2f} |")
    result = {"rows": rows, "rounds": a.rounds, "repeat": a.repeat,
              "load_average": os.getloadavg()}  # fmt: skip
    a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
