from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

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


def test_h200_profile_reproduces_its_measurements() -> None:
    p = get_profile("llama-3.1-8b-h200")
    runs = _h200_runs()
    decode = [pt for run in runs for pt in run["decode"] if pt["context"] == 2048]
    assert len(decode) >= 5
    for pt in decode:  # the context the decode model is fitted at
        assert p.itl_s(pt["batch"]) * 1000 == pytest.approx(pt["ms"], rel=0.03), pt
    prefill = [pt["tok_s"] for run in runs for pt in run["prefill"]
               if pt["prefix"] == 0 and pt["chunk"] >= 1024]  # fmt: skip
    assert min(prefill) <= p.prefill_tok_s <= max(prefill)
    assert p.prefill_tok_s == pytest.approx(statistics.median(prefill), rel=0.01)
    kv = runs[0]["kv_capacity"]["kv_tokens_at_mem_fraction"]["0.88"]
    assert p.max_total_tokens == pytest.approx(kv, rel=0.001)


def test_h200_profile_understates_long_contexts_as_documented() -> None:
    """The context-free model is fitted at 2,048 tokens per stream: at 12,288 tokens a real step
    is far longer (docs/emulator.md says so); at 1,024 tokens a little shorter."""
    p = get_profile("llama-3.1-8b-h200")
    points = {(pt["batch"], pt["context"]): pt["ms"] for pt in _h200_runs()[0]["decode"]}
    assert points[(64, 12288)] > 2.5 * p.itl_s(64) * 1000
    assert points[(256, 1024)] < p.itl_s(256) * 1000


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
