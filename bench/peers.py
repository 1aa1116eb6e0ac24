"""The cost of governance beside the gateways users would pick instead (issue 12), one command.

Arms, back to back, each started fresh in front of the same SGLang emulators: no gateway (the
latency baseline), plain Envoy, tokenweir's full governance path, the LiteLLM proxy with per-key
TPM limits, sglang-router with its own rate limit. Per arm: k6 closed loop (requests/s at
saturation, CPU per request of every process), k6 open loop with a multi-tenant tier mix and
bursts (TTFB and total time), the streaming client (time to first token, gaps between chunks),
and token-budget bursts of N parallel requests on one key after a history of answers on it, in
variants (short answers, long answers, CJK/code prompts, prompts crafted against an estimator;
``peers_budget``): tokens served / allowed (burst + refill), the share in answers that ended by
themselves, the overshoot, the gateway's false rejects.
Then the rate-limit service alone: its maximum decisions/s (closed loop) and an open loop at half
of it. Token lengths come from the Mooncake trace sample; every request streams (``--no-stream``:
k6's requests ask for one JSON answer, which leaves the gateways' per-chunk work out).

    .venv/bin/python bench/peers.py             # the default run, sized for a 2-core machine
    .venv/bin/python bench/peers.py --smoke     # seconds per arm: CI (tests/integration)
    .venv/bin/python bench/peers.py --scale 4   # 4x the users, rates, replicas and bursts
    .venv/bin/python bench/peers.py --phases budget --arms tokenweir litellm sglang-router

Writes ``bench/results/peers.json``, ``bench/results/peers.md`` and ``docs/img/peers_*.png``
(``--out-dir`` / ``--img-dir``; ``--name`` for other names). With the budget phase the emulators
count prompts with a byte-level BPE (``tests/chat_model.py``, ``--tokenizer-path``), so CJK and
crafted prompts cost them what they cost a model, and end answers with a per-token EOS chance
(``--stop-prob``; requests that must run to ``max_tokens`` set ``ignore_eos``): to measure the
other phases as before, run them without ``budget``. The LiteLLM proxy runs from ``.venv-peers/`` (created on first
use; ``--no-install`` skips its arm instead). docs/benchmarks.md ("Beside LiteLLM and
sglang-router") explains every number.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from overload_workload import load_sample  # noqa: E402
from peers_arms import ARMS, MODEL, BudgetSpec, Emulators, PeerArm, make_arm  # noqa: E402
from peers_budget import EOS_PROB, VARIANTS, BudgetBurst, plan_bursts  # noqa: E402
from peers_litellm import ensure_venv  # noqa: E402
from peers_phases import budget_burst, chunk_timing, run_k6  # noqa: E402
from peers_report import write_outputs  # noqa: E402
from peers_rls import rls_phase  # noqa: E402
from peers_workload import PeerRequest, build_requests, chat_body  # noqa: E402

from chat.tokenizer import HfChatTokenizer  # noqa: E402
from tests.chat_model import make_model_dir  # noqa: E402
from tests.helpers import redis_server  # noqa: E402

PHASES = ("saturation", "mix", "chunks", "budget", "rls")


@dataclass(frozen=True)
class Config:
    replicas: int
    running: int
    time_scale: float
    length_scale: int
    vus: int
    seconds: float
    rate: float
    burst: float
    mix_seconds: float
    chunk_requests: int
    chunk_rate: float
    bursts: tuple[int, ...]
    rls_seconds: float
    seed: int
    stream: bool = True  # k6's requests stream (--no-stream: one JSON answer each)
    variants: tuple[str, ...] = VARIANTS
    warmup: int = 30  # the history before each burst: sequential requests on its key
    history_sync_s: float = 4.5  # for tokenweir's filter processes to share what they learned
    settle_s: float = 1.0  # after a burst, for its last settlements to reach the service
    rls_warmup_s: float = 1.0  # the rate-limit phase's warm-up load per setup (0: none)
    oversubscribe: float = 2.0  # a burst asks this many times its budget
    phases: tuple[str, ...] = PHASES


def config(a: argparse.Namespace) -> Config:
    if a.smoke:
        return Config(
            replicas=1, running=16, time_scale=0.05, length_scale=32, vus=4, seconds=1.0,
            rate=4.0, burst=2.0, mix_seconds=2.0, chunk_requests=6, chunk_rate=6.0,
            bursts=(5, 10), rls_seconds=0.5, seed=a.seed, stream=not a.no_stream,
            variants=tuple(a.budget_variants), warmup=2, history_sync_s=0.2, settle_s=0.2,
            rls_warmup_s=0.0, phases=tuple(a.phases),
        )  # fmt: skip
    k = a.scale
    return Config(
        replicas=2 * k, running=64 * k, time_scale=a.time_scale, length_scale=a.length_scale,
        vus=a.vus * k, seconds=a.seconds, rate=a.rate * k, burst=3.0, mix_seconds=12.0,
        chunk_requests=40 * k, chunk_rate=5.0 * k, bursts=tuple(a.bursts), rls_seconds=4.0,
        seed=a.seed, stream=not a.no_stream, variants=tuple(a.budget_variants), warmup=a.warmup,
        oversubscribe=a.oversubscribe, phases=tuple(a.phases),
    )  # fmt: skip


async def measure_arm(
    arm: PeerArm,
    emus: Emulators,
    cfg: Config,
    requests: list[PeerRequest],
    req_file: Path,
    tmp: Path,
    bursts: list[BudgetBurst],
    prompt_tokens: Any,
) -> dict[str, Any]:
    pids = [*arm.pids(), *emus.pids()]
    out: dict[str, Any] = {}
    # warm-up: connections, JIT-free code paths, the emulators' first requests
    await chunk_timing(arm.urls, MODEL, requests[:4], 0.0, cfg.seed)
    if "saturation" in cfg.phases:
        out["saturation"] = run_k6("saturation", arm.urls, req_file, tmp,
                                   {"VUS": str(cfg.vus), "DUR": str(cfg.seconds)}, pids)  # fmt: skip
    if "mix" in cfg.phases:
        out["mix"] = run_k6(
            "mix", arm.urls, req_file, tmp,
            {"RATE": str(cfg.rate), "DUR": str(cfg.mix_seconds), "BURST": str(cfg.burst),
             "BURST_S": "1", "PERIOD_S": "4"}, pids,
        )  # fmt: skip
    if "chunks" in cfg.phases:
        out["chunks"] = await chunk_timing(
            arm.urls, MODEL, requests[-cfg.chunk_requests :], cfg.chunk_rate, cfg.seed
        )
    if "budget" in cfg.phases:
        out["budget"] = []
        if arm.name != "direct":
            for b in bursts:
                print(f"[peers] {arm.name}: budget {b.variant} x{b.parallel}", flush=True)
                out["budget"].append(
                    await budget_burst(
                        arm,
                        b,
                        emus.urls,
                        MODEL,
                        cfg.seed,
                        prompt_tokens,
                        cfg.history_sync_s,
                        cfg.settle_s,
                    )
                )
    return out


def prompt_counter(model_dir: Path) -> Any:
    """Prompt tokens of a one-message chat request as the emulators count them."""
    tok = HfChatTokenizer.load(model_dir)
    cache: dict[str, int] = {}

    def count(prompt: str) -> int:
        if prompt not in cache:
            body = {"messages": [{"role": "user", "content": prompt}]}
            cache[prompt] = len(tok.encode(tok.render_request(body)))
        return cache[prompt]

    return count


async def run(a: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    records = load_sample()
    rng = random.Random(cfg.seed)
    count = max(2000, cfg.vus * 400)
    requests = build_requests(records, count, length_scale=cfg.length_scale, rng=rng)
    arms = list(a.arms)
    skipped: dict[str, str] = {}
    if "litellm" in arms:
        why = ensure_venv(install=not a.no_install)
        if why is not None:
            print(why, flush=True)
            skipped["litellm"] = why
            arms.remove("litellm")
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "mean_prompt_tokens": sum(r.prompt_tokens for r in requests) / len(requests),
        "mean_output_tokens": sum(r.max_tokens for r in requests) / len(requests),
        "skipped": skipped,
        "loadavg_before": os.getloadavg(),
        "cpus": os.cpu_count(),
        "arms": {},
    }
    with tempfile.TemporaryDirectory(prefix="tw-peers-") as d, redis_server() as redis_port:
        tmp = Path(d)
        req_file = tmp / "requests.json"
        req_file.write_text(
            json.dumps(
                [{"key": r.key, "tier": r.tier, "body": json.dumps(chat_body(r, MODEL, cfg.stream))}
                 for r in requests]
            )
        )  # fmt: skip
        model_dir = make_model_dir(tmp / "bpe") if "budget" in cfg.phases else None
        counter = prompt_counter(model_dir) if model_dir else None
        bursts = (
            plan_bursts(cfg.variants, cfg.bursts, warmup=cfg.warmup, oversubscribe=cfg.oversubscribe,
                        rng=random.Random(cfg.seed), prompt_tokens=counter)
            if counter else []
        )  # fmt: skip
        budgets = {
            b.key: BudgetSpec(b.burst, b.refill_per_second, b.mean_request_tokens) for b in bursts
        }
        result["budgets"] = {
            b.key: {"variant": b.variant, "parallel": b.parallel, "burst": b.burst,
                    "refill_per_second": b.refill_per_second,
                    "mean_request_tokens": round(b.mean_request_tokens, 1)}
            for b in bursts
        }  # fmt: skip
        # the budget phase's answers end by themselves (k6's trace requests' answers run to their
        # max_tokens only without it): the budget phase asks for its own emulator settings
        eos = EOS_PROB if "budget" in cfg.phases else 0.0
        emus = Emulators(cfg.replicas, tmp, cfg.time_scale, cfg.running, model_dir, eos)
        await emus.start()
        try:
            for name in arms:
                arm = make_arm(name, emus, tmp, budgets, redis_port, a.baseline_src)
                print(f"[peers] {name}: starting", flush=True)
                try:
                    await arm.start()
                    result["arms"][name] = await measure_arm(
                        arm, emus, cfg, requests, req_file, tmp, bursts, counter
                    )
                finally:
                    await arm.aclose()
                print(f"[peers] {name}: done", flush=True)
        finally:
            await emus.aclose()
        if "rls" in cfg.phases and not a.no_rls:
            result["rls"] = rls_phase(tmp, cfg.rls_seconds, warmup=cfg.rls_warmup_s)
    result["loadavg_after"] = os.getloadavg()
    return result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--smoke", action="store_true", help="seconds per arm (CI)")
    p.add_argument("--scale", type=int, default=1, help="multiply users, rates, replicas")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS[:5]))
    p.add_argument("--vus", type=int, default=16, help="closed-loop k6 users (saturation)")
    p.add_argument("--seconds", type=float, default=8.0, help="saturation run per arm")
    p.add_argument("--rate", type=float, default=10.0, help="open-loop requests/s (mix)")
    p.add_argument(
        "--bursts",
        type=int,
        nargs="+",
        default=[100, 300],
        help="parallel requests of each budget test",
    )
    p.add_argument(
        "--budget-variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="the budget bursts' workloads (bench/peers_budget.py)",
    )
    p.add_argument(
        "--phases",
        nargs="+",
        choices=PHASES,
        default=list(PHASES),
        help="which phases run (e.g. --phases budget)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=30,
        help="history before each budget burst: sequential requests on its key",
    )
    p.add_argument(
        "--oversubscribe",
        type=float,
        default=2.0,
        help="a budget burst asks this many times its budget",
    )
    p.add_argument("--name", default="peers", help="the results' file names (NAME.json, .md)")  # fmt: skip
    p.add_argument("--time-scale", type=float, default=0.05, help="emulated durations x")
    p.add_argument("--length-scale", type=int, default=16, help="trace lengths / k")
    p.add_argument("--no-install", action="store_true", help="skip LiteLLM if .venv-peers lacks it")
    p.add_argument("--no-rls", action="store_true", help="skip the rate-limit service phase")
    p.add_argument("--no-stream", action="store_true",
                   help="k6 phases send non-streaming requests (the chunk and budget phases "
                   "still stream): what a gateway costs without its per-chunk work")  # fmt: skip
    p.add_argument("--baseline-src", type=Path,
                   help="a checkout (e.g. a git archive) whose code the tokenweir-baseline arm "
                   "runs")  # fmt: skip
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--img-dir", type=Path, default=HERE.parent / "docs" / "img")
    a = p.parse_args()
    if "tokenweir-baseline" in a.arms and a.baseline_src is None:
        p.error("the tokenweir-baseline arm needs --baseline-src")
    if len(set(a.bursts)) != len(a.bursts) or min(a.bursts) < 1:
        p.error("--bursts: distinct sizes >= 1")
    cfg = config(a)
    result = asyncio.run(run(a, cfg))
    write_outputs(result, a.out_dir, a.img_dir, a.name)
    print((a.out_dir / f"{a.name}.md").read_text())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
