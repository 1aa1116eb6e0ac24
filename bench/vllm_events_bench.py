"""What reading vLLM's KV events costs the picker against SGLang's, per stored block, in one run.

SGLang's block hashes are the picker's own (``decode_for_index`` keeps them without decoding
token ids); vLLM's are seeded per process, so each stored block's hash is recomputed from the
event's token ids (``VllmBlockMap.read``: decode the tokens, one SHA-256 per block, a dict entry).
Both sides decode the same token streams (``--events`` events of ``--blocks`` blocks of
``--block-size`` tokens), alternating, ``--rounds`` times; medians of µs per block.

``.venv/bin/python bench/vllm_events_bench.py [--block-size 16] [--blocks 64] [--rounds 7]``;
results in ``bench/results/vllm_events_bench.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from pathlib import Path

from prefixindex.hashing import prefix_block_ids
from prefixindex.vllm_wire import (
    VllmBlockMap,
    VllmBlockStored,
    VllmEventBatch,
    encode_vllm_batch,
)
from prefixindex.wire import BlockStored, KVEventBatch, decode_for_index, encode_batch

OUT = Path(__file__).parent / "results" / "vllm_events_bench.json"


def payloads(
    events: int, blocks: int, size: int, rng: random.Random
) -> tuple[list[bytes], list[bytes]]:
    vllm, sglang = [], []
    for e in range(events):
        tokens = [rng.randrange(150_000) for _ in range(blocks * size)]
        prior, hashes = e.to_bytes(32, "big"), []
        for i in range(blocks):
            prior = hashlib.sha256(
                prior + repr(tokens[i * size : (i + 1) * size]).encode()
            ).digest()
            hashes.append(prior)
        stored = VllmBlockStored(hashes, None, tokens, size, None, "GPU", None)
        vllm.append(encode_vllm_batch(VllmEventBatch(ts=1.0, events=[stored])))
        ours = BlockStored(prefix_block_ids(tokens, size), None, tokens, size, None, "GPU")
        sglang.append(encode_batch(KVEventBatch(ts=1.0, events=[ours])))
    return vllm, sglang


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--events", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    vllm, sglang = payloads(a.events, a.blocks, a.block_size, random.Random(1))
    n = a.events * a.blocks
    v_us, s_us = [], []
    for _ in range(a.rounds):
        m = VllmBlockMap(a.block_size)
        t = time.perf_counter()
        for seq, raw in enumerate(vllm, 1):
            m.read(seq, raw)
        v_us.append((time.perf_counter() - t) / n * 1e6)
        t = time.perf_counter()
        for raw in sglang:
            decode_for_index(raw)
        s_us.append((time.perf_counter() - t) / n * 1e6)
    result = {
        "block_size": a.block_size,
        "blocks_per_event": a.blocks,
        "vllm_us_per_block": round(statistics.median(v_us), 2),
        "sglang_us_per_block": round(statistics.median(s_us), 2),
    }
    result["ratio"] = round(result["vllm_us_per_block"] / result["sglang_us_per_block"], 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
