"""Replaying prefix-block traces (the Mooncake conversation trace) as text.

A trace line has ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``: one id
per 512-token block of the prompt. ``prompt_text`` gives every id a deterministic block of words
(``tokenizer.trace_block_text``), so equal ids give equal tokens and the prefix structure is kept
exactly; the last block is trimmed to the prompt's length.

Scaling: ``scale`` = k divides every length by k (blocks become ``512 // k`` tokens, the prompt
``ceil(input_length / k)`` tokens, its last block trimmed to fit, at least 1 token), so a slice fits
this machine; the block-sharing structure is unchanged. ``ideal_cached_tokens`` computes, from the
ids alone and independently of the radix tree, what an infinitely large cache would serve.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from backends.emulator.tokenizer import trace_block_text

__all__ = ["TraceRecord", "ideal_cached_tokens", "load_trace", "prompt_text", "scaled_blocks"]

BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: Path, limit: int | None = None) -> list[TraceRecord]:
    """The first ``limit`` records of a JSONL trace."""
    out: list[TraceRecord] = []
    with path.open() as fh:
        for line in fh:
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            d = json.loads(line)
            out.append(
                TraceRecord(
                    timestamp_ms=int(d["timestamp"]),
                    input_length=int(d["input_length"]),
                    output_length=int(d["output_length"]),
                    hash_ids=tuple(int(h) for h in d["hash_ids"]),
                )
            )
    return out


def scaled_blocks(rec: TraceRecord, scale: int = 1) -> list[tuple[int, int]]:
    """(block id, tokens) per block after dividing lengths by ``scale``."""
    if scale < 1 or BLOCK_TOKENS % scale:
        raise ValueError(f"scale must divide {BLOCK_TOKENS}, got {scale}")
    block = BLOCK_TOKENS // scale
    total = math.ceil(rec.input_length / scale)
    n = len(rec.hash_ids)
    last = min(max(total - (n - 1) * block, 1), block)
    return [(h, block if i < n - 1 else last) for i, h in enumerate(rec.hash_ids)]


def prompt_text(rec: TraceRecord, scale: int = 1) -> str:
    """The prompt of one record as text (one token per word under the emulator's tokenizer)."""
    return " ".join(trace_block_text(h, n) for h, n in scaled_blocks(rec, scale))


def _ideal(records: Iterable[TraceRecord], scale: int) -> Iterator[tuple[int, int]]:
    seen: dict[tuple[int, ...], int] = {}  # block-id prefix -> most tokens of its last block seen
    for rec in records:
        blocks = scaled_blocks(rec, scale)
        prompt_len = sum(n for _, n in blocks)
        cached = 0
        for i, (_, n) in enumerate(blocks):
            have = seen.get(rec.hash_ids[: i + 1], 0)
            cached += min(have, n)
            if have < n:
                break
        yield prompt_len, min(cached, prompt_len - 1)  # one token is always computed
        for i, (_, n) in enumerate(blocks):
            key = rec.hash_ids[: i + 1]
            seen[key] = max(seen.get(key, 0), n)


def ideal_cached_tokens(records: Iterable[TraceRecord], scale: int = 1) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) per record with an infinite prefix cache, in order."""
    return list(_ideal(records, scale))
