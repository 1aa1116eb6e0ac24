"""What the picker costs on the request path for a long prompt (issue 11 item 2: ≤ 3 ms at 300 KB).

Side by side on one prompt (the emulator's word tokenizer, page size 1):

- ``full chain``: tokenize the whole prompt and SHA-256 every page as SGLang does (what a picker
  hashing every request on the request path would pay);
- ``request path``: what the ``picker`` plugin does per request: render, checkpoint digests
  (one SHA-256 pass), checkpoint-map lookups, the index walk and the score (the prompt's map
  entries present: a conversation's next turn or a shared document);
- ``request path, unseen``: the same for a prompt never seen (nothing mapped: the walk stops at
  once);
- ``mapper, new text``: the off-path work for an unseen prompt (tokenize + hash, in slices).

Medians of ``--runs`` runs; prints one line per case and the ratio.

    .venv/bin/python bench/routing_hash.py --kb 300 --runs 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.emulator.radix_cache import RadixCache  # noqa: E402
from backends.emulator.tokenizer import encode  # noqa: E402
from filters.plugins.picker.metrics import PickerMetrics  # noqa: E402
from filters.plugins.picker.pool import PoolPicker  # noqa: E402
from filters.plugins.picker.prompt import prompt_bytes  # noqa: E402
from policy.model import Address, LlmPool  # noqa: E402
from policy.routing import RoutingPolicy  # noqa: E402
from prefixindex.hashing import prefix_block_ids  # noqa: E402
from prefixindex.wire import KVEventBatch  # noqa: E402


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", type=int, default=300)
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    words: list[str] = []
    size = 0
    while size < a.kb * 1024:
        w = f"b{len(words) // 512}w{len(words) % 512}"
        words.append(w)
        size += len(w) + 1
    text = " ".join(words)
    messages = [{"role": "system", "content": "be helpful"}, {"role": "user", "content": text}]
    names = [f"127.0.0.1:{7000 + i}" for i in range(4)]
    cfg = LlmPool(
        models=("m",),
        endpoints=tuple(Address.parse(n) for n in names),
        routing=RoutingPolicy(mode="prefix_index"),
    )
    picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()))
    data = prompt_bytes("chat", {"messages": messages})
    assert data is not None
    ids = encode(data.decode())
    cache = RadixCache(10**7, record_events=True)
    cache.insert(ids)
    now = picker._clock()
    for n in names:
        if n == names[2]:
            picker.index.apply(n, 0, KVEventBatch(0.0, cache.take_events()))
        else:
            picker.index.apply(
                n, 0, KVEventBatch(0.0, RadixCache(10, record_events=True).take_events())
            )
        picker.index.heard(n, now + 3600)
    # map it once (the mapper's job), timed as the off-path cost
    t0 = time.perf_counter()
    p = picker.prompt(data)
    picker.map.extend(p.data, p.marks, 0, len(p.marks))
    mapper_ms = (time.perf_counter() - t0) * 1000

    def request_path() -> object:
        d = prompt_bytes("chat", {"messages": messages})
        assert d is not None
        return picker.pick(picker.prompt(d))

    unseen = [{"role": "user", "content": "zz " + text}]

    def request_unseen() -> object:
        d = prompt_bytes("chat", {"messages": unseen})
        assert d is not None
        return picker.pick(picker.prompt(d))

    pick = request_path()
    full = _median_ms(lambda: prefix_block_ids(encode(data.decode()), 1), max(3, a.runs // 3))
    path = _median_ms(request_path, a.runs)
    cold = _median_ms(request_unseen, a.runs)
    print(f"prompt: {len(data) / 1024:.0f} KB, {len(ids)} tokens, page size 1; pick: {pick}")
    print(f"full chain (tokenize + SHA-256 per page): {full:8.2f} ms")
    print(f"request path, prompt mapped:              {path:8.2f} ms  ({full / path:.0f}x less)")
    print(f"request path, prompt unseen:              {cold:8.2f} ms")
    print(f"mapper, whole prompt (off the path, once): {mapper_ms:7.2f} ms")


if __name__ == "__main__":
    main()
