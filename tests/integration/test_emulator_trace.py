"""Replay a slice of the real Mooncake trace (text per 512-token block id) through one emulator."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from backends.emulator.tokenizer import encode
from backends.emulator.trace import (
    TraceRecord,
    ideal_cached_tokens,
    load_trace,
    prompt_text,
)

pytestmark = pytest.mark.integration

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_conversation_first400.jsonl"
SLICE = 400
SCALE = 16  # 512-token blocks become 32 tokens; block sharing is unchanged


@pytest.fixture(scope="module")
def records() -> list[TraceRecord]:
    return load_trace(TRACE, limit=SLICE)


async def _replay(server: EmulatorServer, records: list[TraceRecord]) -> list[tuple[int, int]]:
    """Send the slice in order, one at a time; (prompt tokens, cached tokens) per request."""
    out: list[tuple[int, int]] = []
    async with aiohttp.ClientSession() as http:
        for rec in records:
            body = {"model": "m", "prompt": prompt_text(rec, SCALE), "max_tokens": 2}
            async with http.post(server.url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
            details = usage["prompt_tokens_details"]
            out.append((usage["prompt_tokens"], details["cached_tokens"] if details else 0))
    return out


def _ratio(pairs: list[tuple[int, int]]) -> float:
    return sum(c for _, c in pairs) / sum(p for p, _ in pairs)


async def test_ample_cache_hits_exactly_what_the_block_ids_imply(
    records: list[TraceRecord],
) -> None:
    server = await start_emulator(
        EmulatorSettings(profile="llama-3.1-8b-h100", time_scale=0.001, cache_tokens=10_000_000)
    )
    try:
        got = await _replay(server, records)
    finally:
        await server.aclose()
    expected = ideal_cached_tokens(records, SCALE)
    assert got == expected  # per request, not only on average
    assert _ratio(got) == pytest.approx(_ratio(expected), abs=0)
    assert _ratio(got) > 0.1  # the slice does share prefixes


async def test_small_cache_hits_less_and_evicts_least_recently_used(
    records: list[TraceRecord],
) -> None:
    server = await start_emulator(
        EmulatorSettings(profile="llama-3.1-8b-h100", time_scale=0.001, cache_tokens=30_000)
    )
    try:
        got = await _replay(server, records)
        cache = server.scheduler.cache
        cache.check_invariants()
        assert cache.total_size <= 30_000
        # the most recent prompt is still cached in full (and its answer after it)
        last = encode(prompt_text(records[-1], SCALE))
        assert cache.match_prefix(last).length == len(last)
        # the oldest prompts whose own blocks nobody reused later are gone
        later_ids = {h for rec in records[50:] for h in rec.hash_ids}
        stale = [
            r for r in records[:50] if not set(r.hash_ids[1:]) & later_ids and len(r.hash_ids) > 1
        ]
        assert stale
        for rec in stale:
            ids = encode(prompt_text(rec, SCALE))
            assert cache.match_prefix(ids).length < len(ids)
    finally:
        await server.aclose()
    ideal = ideal_cached_tokens(records, SCALE)
    assert _ratio(got) < _ratio(ideal)
    assert all(c <= i for (_, c), (_, i) in zip(got, ideal, strict=True))
