"""Cache-aware routing in one process, on a virtual clock (issue 11): no network, no Envoy.

Each replica is the emulator's real ``Scheduler`` (continuous batching over its real radix cache,
timed by the profile). Its KV events go through the wire encoder and decoder into the picker's
prefix index, as they would over ZMQ, but at once and without loss. ``--concurrency`` closed-loop
clients send the same jobs as ``bench/routing.py`` (trace slice or shared documents); a router
(``bench/routing_sim_routers.py``) names the replica for each:

- ``picker``: the real :class:`filters.plugins.picker.pool.PoolPicker` (checkpoints, the checkpoint map,
  the prefix index, :func:`filters.plugins.picker.score.choose`); the map is filled right after the pick;
- ``ring_hash``: rendezvous hash of the first 256 tokens with bounded load (like Envoy's ring hash
  with ``hash_balance_factor``);
- ``approx_tree``: sglang-router ``cache_aware`` as its docs describe it (one approximate prefix
  tree per worker, filled at routing time; match ratio > 0.3 → best match, else the worker with
  the smallest tree; its load rule does not fire below 64 requests apart).

Printed per router: hit ratio, TTFT p50/p99 (virtual time: the emulator's timing model only),
max/mean requests per replica; for the picker also predicted vs actual cached tokens per
request, and the check that matters for the index: at every admission the index, asked just before
the radix cache matches, must give exactly the cache's match (``index exact``).

    .venv/bin/python bench/routing_sim.py --workload trace --routers picker ring_hash approx_tree
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import hashlib
import random
import selectors
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from backends.emulator.request import EmuRequest, GenerationParams  # noqa: E402
from backends.emulator.scheduler import Scheduler  # noqa: E402
from backends.emulator.tokenizer import encode, render_chat  # noqa: E402
from backends.emulator.trace import load_trace  # noqa: E402
from backends.profiles import get_profile  # noqa: E402
from bench.routing import TRACE  # noqa: E402
from bench.routing_jobs import (  # noqa: E402
    combined_lru_hit_ratio,
    docs_jobs,
    session_jobs,
    trace_jobs,
)
from bench.routing_sim_routers import (  # noqa: E402
    ApproxTreeRouter,
    Job,
    PickerRouter,
    RingHashRouter,
    Router,
    probe,
)
from filters.plugins.picker.metrics import PickerMetrics  # noqa: E402
from filters.plugins.picker.pool import PoolPicker  # noqa: E402
from policy.model import Address, LlmPool  # noqa: E402
from policy.routing import RoutingPolicy  # noqa: E402
from prefixindex.hashing import prefix_block_ids  # noqa: E402
from prefixindex.wire import KVEventBatch, decode_for_index, encode_batch  # noqa: E402

ROUTERS = ("picker", "ring_hash", "approx_tree")


class _VirtualSelector(selectors.DefaultSelector):
    """``select(timeout)`` returns at once and moves the loop's virtual clock by ``timeout``."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout:
            self.now += timeout
        return ready


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual: sleeping costs no wall time."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


@dataclasses.dataclass
class Outcome:
    ttft: list[float] = dataclasses.field(default_factory=list)
    per_replica: list[int] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted: int = 0
    over: int = 0  # requests whose prediction exceeded what the replica matched
    admissions: int = 0
    index_wrong: int = 0  # admissions where the index disagreed with the radix cache
    coalesced: dict[str, int] = dataclasses.field(default_factory=dict)  # picker: waits by outcome
    waited: float = 0.0  # picker: seconds waited for others' prefills, in all

    def summary(self) -> dict[str, Any]:
        q = statistics.quantiles(self.ttft, n=100) if len(self.ttft) > 1 else [0.0] * 99
        mean = sum(self.per_replica) / len(self.per_replica)
        return {
            "hit_ratio": self.cached_tokens / max(1, self.prompt_tokens),
            "ttft_p50_ms": 1000 * statistics.median(self.ttft),
            "ttft_p95_ms": 1000 * q[94],
            "ttft_p99_ms": 1000 * q[98],
            "max_over_mean": max(self.per_replica) / mean if mean else 0.0,
            "per_replica": self.per_replica,
            "predicted_tokens": self.predicted,
            "over_predicted_requests": self.over,
            "admissions": self.admissions,
            "index_wrong": self.index_wrong,
            "coalesced": self.coalesced,
            "coalesce_wait_mean_ms": 1000 * self.waited / max(1, sum(self.coalesced.values())),
        }


def _picker(names: list[str], a: argparse.Namespace, clock: Callable[[], float]) -> PoolPicker:
    routing = RoutingPolicy(
        mode="prefix_index",
        min_prefix_tokens=max(16, 512 // a.scale // 2),
        checkpoint_bytes=512,
        pending_ttl=a.pending_ttl,
        cache_weight=a.cache_weight,
        max_imbalance=a.max_imbalance,
        anchor_tokens=a.anchor_tokens,
        backlog_weight=a.backlog_weight,
        backlog_allowance=a.backlog_allowance,
        sticky_share=a.sticky_share,
        coalesce_wait=a.coalesce_wait,
        balance_window=a.balance_window,
        max_share=a.max_share,
        scoring=a.scoring,
    )
    cfg = LlmPool(models=("m",), endpoints=tuple(Address.parse(n) for n in names), routing=routing)
    return PoolPicker("sim", cfg, PickerMetrics(CollectorRegistry()), clock=clock, wall=clock)


async def simulate(router_name: str, jobs: list[Job], a: argparse.Namespace) -> Outcome:
    loop = asyncio.get_running_loop()
    profile = dataclasses.replace(
        get_profile(a.profile), max_total_tokens=a.cache_tokens // a.scale
    )
    names = [f"127.0.0.1:{7000 + i}" for i in range(a.replicas)]
    picker = _picker(names, a, loop.time)
    index, out = picker.index, Outcome(per_replica=[0] * a.replicas)
    seqs = [0] * a.replicas

    def sink(i: int) -> Callable[[list[Any]], None]:
        def publish(events: list[Any]) -> None:
            raw = encode_batch(KVEventBatch(ts=loop.time(), events=events))
            index.apply(names[i], seqs[i], decode_for_index(raw, index.anchor_every))
            index.heard(names[i], loop.time())
            seqs[i] += 1

        return publish

    scheds = [
        Scheduler(profile, time_scale=a.time_scale, clock=loop.time, kv_sink=sink(i))
        for i in range(a.replicas)
    ]
    for i, s in enumerate(scheds):
        _watch_admissions(s, i, names[i], picker, out)
        s.start()
    router: Router
    if router_name == "picker":
        router = PickerRouter(picker, names, a.map_delay)
    elif router_name == "ring_hash":
        router = RingHashRouter(a.replicas)
    else:
        router = ApproxTreeRouter(a.replicas, 8 * a.cache_tokens // a.scale)
    queue = collections.deque(enumerate(jobs))
    inflight = [0] * a.replicas

    async def client() -> None:
        while queue:
            k, job = queue.popleft()
            replica, predicted = router.pick(job, inflight)
            inflight[replica] += 1
            out.per_replica[replica] += 1
            t0 = loop.time()
            await router.hold(job)  # the TTFT counts the wait
            params = GenerationParams(job.ids, job.max_tokens, ignore_eos=True)
            req = EmuRequest(str(k), params, random.Random(k), arrival=loop.time())
            scheds[replica].add(req)
            while not req.done:
                await req.event.wait()
                req.event.clear()
            inflight[replica] -= 1
            router.done(replica, job)
            if isinstance(router, PickerRouter):
                first, end = req.first_token_at, loop.time()
                n = job.max_tokens
                step = (end - first) / (n - 1) if first is not None and n > 1 else None
                router.learn(replica, job, None if first is None else first - t0, step)
            if req.first_token_at is not None:
                out.ttft.append(req.first_token_at - t0)
            out.prompt_tokens += len(job.ids)
            out.cached_tokens += req.cached_tokens
            out.predicted += predicted
            out.over += predicted > req.cached_tokens

    await asyncio.gather(*(client() for _ in range(a.concurrency)))
    if isinstance(router, PickerRouter):
        out.coalesced, out.waited = dict(router.coalesced), router.waited
    for s in scheds:
        await s.aclose()
    return out


def _watch_admissions(s: Scheduler, i: int, name: str, picker: PoolPicker, out: Outcome) -> None:
    """Before each match of replica ``i``'s radix cache, publish its events and ask the index."""
    real = s.cache.match_prefix
    clock = picker._clock

    def match(tokens: Sequence[int], *rest: Any) -> Any:  # rest: the LoRA adapter's id
        s.publish_kv_events()
        probe(picker)
        said = picker.index.query(list(tokens), clock())[name]
        result = real(tokens, *rest)
        out.admissions += 1
        # exact at the index's anchor granularity: the match rounded down to its last anchor
        blocks = prefix_block_ids(tokens, picker.index.page_size)
        out.index_wrong += said != picker.index.anchored(blocks, result.length)
        return result

    s.cache.match_prefix = match  # type: ignore[method-assign]


def make_jobs(a: argparse.Namespace) -> tuple[list[Job], float]:
    if a.workload == "trace":
        texts, ceiling = trace_jobs(load_trace(TRACE)[a.start : a.start + a.requests], a.scale)
    elif a.workload == "sessions":
        texts, ceiling = session_jobs(a.requests, a.sessions, seed=a.start)
    else:
        texts, ceiling = docs_jobs(a.requests, a.docs, a.doc_words, seed=a.start)
    lru = combined_lru_hit_ratio(texts, a.replicas * (a.cache_tokens // a.scale))
    print(f"one LRU cache of the pool's size: {lru:.3f}")
    jobs = []
    for text, max_tokens in texts:
        rendered = render_chat([{"role": "user", "content": text}])
        jobs.append(Job(rendered.encode(), tuple(encode(rendered)), max_tokens))
    return jobs, ceiling


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("trace", "docs", "sessions"), default="trace")
    ap.add_argument("--sessions", type=int, default=60, help="sessions workload: sessions")
    ap.add_argument(
        "--scoring", choices=("weights", "predicted_ttft"), default="weights",
        help="picker: routing.scoring (predicted_ttft learns from the simulated TTFTs)",
    )  # fmt: skip
    ap.add_argument("--docs", type=int, default=24)
    ap.add_argument("--doc-words", type=int, default=3000)
    ap.add_argument("--start", type=int, default=500)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--cache-tokens", type=int, default=460_000)
    ap.add_argument("--pending-ttl", type=float, default=5.0)
    ap.add_argument("--cache-weight", type=float, default=0.7)
    ap.add_argument("--max-imbalance", type=float, default=1.5)
    ap.add_argument("--anchor-tokens", type=int, default=16, help="routing.anchor_tokens")
    ap.add_argument("--backlog-weight", type=float, default=1.0, help="routing.backlog_weight")
    ap.add_argument("--backlog-allowance", type=int, default=8192, help="routing.backlog_allowance")
    ap.add_argument("--sticky-share", type=float, default=0.5, help="routing.sticky_share")
    ap.add_argument("--balance-window", type=int, default=64, help="routing.balance_window")
    ap.add_argument("--coalesce-wait", type=float, default=1.0, help="routing.coalesce_wait (s)")
    ap.add_argument("--max-share", type=float, default=1.3, help="routing.max_share")
    ap.add_argument("--map-delay", type=float, default=0.0, help="picker: mapper lag (s)")
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    a = ap.parse_args()
    jobs, ceiling = make_jobs(a)
    print(f"{a.workload}: {len(jobs)} jobs, infinite-cache ceiling {ceiling:.3f}")
    digest = hashlib.sha256(b"".join(j.data for j in jobs)).hexdigest()[:12]
    print(f"jobs digest {digest}")
    for name in a.routers:
        loop = VirtualLoop()
        try:
            res = loop.run_until_complete(simulate(name, jobs, a)).summary()
        finally:
            loop.close()
        print(
            f"{name:12s} hit {res['hit_ratio']:.3f}  ttft p50 {res['ttft_p50_ms']:.0f}"
            f" p95 {res['ttft_p95_ms']:.0f} p99 {res['ttft_p99_ms']:.0f} ms  max/mean {res['max_over_mean']:.2f}"
            f" {res['per_replica']}  predicted {res['predicted_tokens']}"
            f" (over on {res['over_predicted_requests']})"
            f"  index exact {res['admissions'] - res['index_wrong']}/{res['admissions']}"
            + (
                f"  coalesced {res['coalesced']} (mean wait {res['coalesce_wait_mean_ms']:.1f} ms)"
                if res["coalesced"]
                else ""
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
