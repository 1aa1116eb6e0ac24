from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.errors import UnknownProfileError
from backends.profiles import BackendProfile, get_profile, profile_names

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_names_and_unknown_name_lists_known() -> None:
    names = profile_names()
    assert "llama-3.1-8b-h100" in names and "seed-2k" in names
    with pytest.raises(KeyError) as info:
        get_profile("nope")
    assert isinstance(info.value, UnknownProfileError)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(("batch", "itl_ms"), [(1, 4.6), (50, 5.9), (100, 7.6), (250, 16.1)])
def test_llama_profile_matches_reference_sweep(batch: int, itl_ms: float) -> None:
    p = get_profile("llama-3.1-8b-h100")
    assert p.itl_s(batch) * 1000 == pytest.approx(itl_ms, rel=0.03)


def test_llama_throughput_flattens() -> None:
    p = get_profile("llama-3.1-8b-h100")
    t50, t100, t250 = (p.decode_throughput_tok_s(b) for b in (50, 100, 250))
    assert t50 < t100 < t250
    # gain from 100 -> 250 streams is far below the 2.5x stream increase
    assert t250 / t100 < 1.3
    assert p.itl_s(250) / p.itl_s(1) == pytest.approx(3.5, rel=0.05)


def _h200_runs() -> list[dict[str, Any]]:
    """The measured step times the H200 profile was fitted to (bench/gpu_profile.py)."""
    return [json.loads((RESULTS / f"gpu_h200_llama8b_{i}.json").read_text()) for i in (1, 2)]


def _rel_errors(p: BackendProfile) -> tuple[list[float], list[float]]:
    decode, prefill = [], []
    for run in _h200_runs():
        for pt in run["decode"]:
            model = p.itl_s(pt["batch"], pt["context"]) * 1000
            decode.append((model - pt["ms"]) / pt["ms"])
        for pt in run["prefill"]:
            n, cached = pt["chunk"], pt["prefix"]
            model = p.prefill_cost_s(n, n * (cached + n / 2)) * 1000
            prefill.append((model - pt["ms"]) / pt["ms"])
    return decode, prefill


def _rms(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs) / len(xs))


def test_h200_profile_reproduces_its_measurements() -> None:
    p = get_profile("llama-3.1-8b-h200")
    assert not p.context_free
    decode, prefill = _rel_errors(p)
    assert len(decode) >= 20 and len(prefill) >= 15
    assert _rms(decode) < 0.10 and max(map(abs, decode)) < 0.35
    assert _rms(prefill) < 0.15 and max(map(abs, prefill)) < 0.35
    kv = _h200_runs()[0]["kv_capacity"]["kv_tokens_at_mem_fraction"]["0.88"]
    assert p.max_total_tokens == pytest.approx(kv, rel=0.001)
    # without its context terms the profile misses long contexts by far: they are needed
    flat = dataclasses.replace(p, decode_per_kv_token_s=0.0, prefill_per_ctx_token_s=0.0)
    flat_decode, flat_prefill = _rel_errors(flat)
    assert _rms(flat_decode) > 2 * _rms(decode) and _rms(flat_prefill) > 2 * _rms(prefill)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 512),
    decode_ctx=st.floats(0, 200_000),
    prefill_ctx=st.floats(0, 200_000),
    chunk=st.integers(1, 20_000),
)
def test_at_context_folds_the_context_terms(
    batch: int, decode_ctx: float, prefill_ctx: float, chunk: int
) -> None:
    p = get_profile("llama-3.1-8b-h200")
    folded = p.at_context(decode_ctx, prefill_ctx, chunk)
    assert folded.context_free and folded.prefill_base_s == 0
    assert folded.itl_s(batch) == pytest.approx(p.itl_s(batch, decode_ctx), rel=1e-9)
    n = min(chunk, p.chunked_prefill_size)  # one chunk, each token attending to prefill_ctx
    assert folded.prefill_cost_s(n) == pytest.approx(p.prefill_cost_s(n, n * prefill_ctx), rel=1e-9)


def test_context_free_profiles_ignore_context() -> None:
    for name in ("llama-3.1-8b-h100", "seed-2k"):
        p = get_profile(name)
        assert p.context_free
        assert p.at_context(12_000, 8_000) == p
        assert p.itl_s(64, 12_000) == p.itl_s(64)
        assert p.step_s(500, 8, 100_000, 10**9) == p.step_s(500, 8)


def test_context_terms_add_to_a_step() -> None:
    p = dataclasses.replace(
        get_profile("seed-2k"),
        decode_per_kv_token_s=1e-8,
        prefill_base_s=2e-3,
        prefill_per_ctx_token_s=1e-9,
    )
    base = get_profile("seed-2k")
    assert p.step_s(0, 4, 40_000) == pytest.approx(base.step_s(0, 4) + 4e-4)
    assert p.step_s(100, 0, 0, 10_000) == pytest.approx(base.step_s(100, 0) + 2e-3 + 1e-5)
    assert p.step_s(0, 0, 10**6, 10**6) == 0.0  # no work, no time
    with pytest.raises(ValueError, match=">= 0"):
        p.at_context(-1)
    with pytest.raises(ValueError, match="decode_per_kv_token_s"):
        dataclasses.replace(p, decode_per_kv_token_s=-1.0)


def test_seed_profile_matches_seed_numbers() -> None:
    p = get_profile("seed-2k")
    assert p.itl_s(40) == pytest.approx(0.020)
    assert p.decode_throughput_tok_s(40) == pytest.approx(2000.0)
    assert p.max_concurrency_for_tbt(0.020) == 40
    batch, peak = p.peak_decode_throughput_tok_s()
    assert 2000 <= peak < 2300
    assert batch > 40


@pytest.mark.parametrize("name", ["llama-3.1-8b-h100", "llama-3.1-8b-h200", "seed-2k"])
@pytest.mark.parametrize("tbt_ms", [1.0, 4.6, 5.0, 8.0, 12.0, 20.0, 30.0, 100.0])
def test_max_concurrency_is_the_largest_batch_within_budget(name: str, tbt_ms: float) -> None:
    p = get_profile(name)
    tbt = tbt_ms / 1000
    n = p.max_concurrency_for_tbt(tbt)
    brute = max(
        (b for b in range(1, p.max_running_requests + 1) if p.itl_s(b) <= tbt + 1e-12),
        default=0,
    )
    assert n == brute


def test_throughput_identity_and_monotone_itl() -> None:
    for name in profile_names():
        p = get_profile(name)
        for b in (1, 2, 7, 40, p.max_running_requests):
            assert p.decode_throughput_tok_s(b) == pytest.approx(b / p.itl_s(b))
            assert p.itl_s(b + 1) > p.itl_s(b) or p.decode_per_seq_s == p.decode_per_seq2_s == 0


def test_step_cost_adds_prefill_and_decode() -> None:
    p = get_profile("seed-2k")
    assert p.step_s(0, 0) == 0.0
    assert p.step_s(0, 40) == pytest.approx(p.itl_s(40))
    assert p.step_s(1000, 40) == pytest.approx(p.itl_s(40) + 1000 / p.prefill_tok_s)


def test_profile_is_frozen_and_validated() -> None:
    p = get_profile("seed-2k")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_total_tokens"):
        dataclasses.replace(p, max_total_tokens=0)
    with pytest.raises(ValueError):
        p.itl_s(0)
    assert isinstance(p, BackendProfile)
