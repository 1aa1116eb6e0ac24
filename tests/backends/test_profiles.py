from __future__ import annotations

import dataclasses

import pytest

from backends.errors import UnknownProfileError
from backends.profiles import BackendProfile, get_profile, profile_names


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


def test_seed_profile_matches_seed_numbers() -> None:
    p = get_profile("seed-2k")
    assert p.itl_s(40) == pytest.approx(0.020)
    assert p.decode_throughput_tok_s(40) == pytest.approx(2000.0)
    assert p.max_concurrency_for_tbt(0.020) == 40
    batch, peak = p.peak_decode_throughput_tok_s()
    assert 2000 <= peak < 2300
    assert batch > 40


@pytest.mark.parametrize("name", ["llama-3.1-8b-h100", "seed-2k"])
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
