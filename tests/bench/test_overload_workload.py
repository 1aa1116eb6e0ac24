"""The overload benchmark's workload: Mooncake lengths, lane mix, open-loop arrivals, capacity."""

from __future__ import annotations

import random

import pytest
from overload_workload import (
    SAMPLE,
    Phase,
    load_sample,
    mean_lengths,
    pool_capacity_rps,
    scaled_lengths,
    schedule,
    spike_phases,
)

from backends.profiles import get_profile

PROFILE = get_profile("llama-3.1-8b-h100")


def test_the_sample_ships_with_the_repository() -> None:
    assert SAMPLE.is_file() and "shared" not in SAMPLE.parts
    records = load_sample()
    assert len(records) > 900
    prompt, output = mean_lengths(records, 1)
    assert 10_000 < prompt < 15_000  # the trace's mean input is 12,035 tokens
    assert 300 < output < 400  # and its mean output 343


def test_lengths_are_divided_by_the_scale_and_never_reach_zero() -> None:
    rec = load_sample()[0]
    p1, o1 = scaled_lengths(rec, 1)
    p16, o16 = scaled_lengths(rec, 16)
    assert p1 == rec.input_length and o1 == rec.output_length
    assert abs(p16 - p1 / 16) <= len(rec.hash_ids) and o16 == -(-o1 // 16)
    tiny = type(rec)(0, 1, 1, (7,))
    assert scaled_lengths(tiny, 16) == (1, 1)


def test_capacity_follows_the_profile_replicas_and_time_scale() -> None:
    base = pool_capacity_rps(
        PROFILE, replicas=1, running=16, mean_prompt=800, mean_output=20, time_scale=1
    )
    per_request = 20 * PROFILE.itl_s(16) / 16 + 800 / PROFILE.prefill_tok_s
    assert base == pytest.approx(1 / per_request)
    kw = {"mean_prompt": 800, "mean_output": 20}
    assert pool_capacity_rps(PROFILE, replicas=3, running=16, time_scale=1, **kw) == pytest.approx(
        3 * base
    )
    assert pool_capacity_rps(PROFILE, replicas=1, running=16, time_scale=5, **kw) == pytest.approx(
        base / 5
    )
    # more slots batch decode better: capacity grows with running, below the prefill bound
    more = pool_capacity_rps(PROFILE, replicas=1, running=64, time_scale=1, **kw)
    assert base < more < PROFILE.prefill_tok_s / 800
    with pytest.raises(ValueError):
        pool_capacity_rps(PROFILE, replicas=0, running=1, time_scale=1, **kw)


def test_schedule_is_seeded_open_loop_and_mixes_lanes() -> None:
    records = load_sample()
    phases = [Phase(60.0, 1.0), Phase(60.0, 3.0)]

    def make(seed: int) -> list:  # type: ignore[type-arg]
        return schedule(
            records, phases, capacity_rps=4.0, interactive_share=0.3, tenants_per_lane=4,
            length_scale=16, rng=random.Random(seed),
        )  # fmt: skip

    a, b = make(7), make(7)
    assert a == b  # every arm of a run gets the same requests at the same offsets
    assert make(8) != a
    first = [x for x in a if x.at < 60]
    second = [x for x in a if x.at >= 60]
    assert 180 < len(first) < 300 and 620 < len(second) < 820  # 4/s, then 12/s
    assert all(x.at < 120 for x in a) and [x.at for x in a] == sorted(x.at for x in a)
    share = sum(x.lane == "interactive" for x in a) / len(a)
    assert 0.24 < share < 0.36
    assert {x.tenant for x in a} == {0, 1, 2, 3}
    prompts = [x.prompt for x in a[: len(records)]]
    assert len(set(prompts)) == len(prompts)  # no prompt repeats: caches start cold
    assert all(x.max_tokens >= 1 and x.prompt_tokens == len(x.prompt.split()) for x in a[:50])


def test_spike_phases() -> None:
    assert spike_phases(0.5, 3.0, 5, 10, 15) == [Phase(5, 0.5), Phase(10, 3.0), Phase(15, 0.5)]
    assert schedule(
        load_sample(), [Phase(10, 0.0)], capacity_rps=5, interactive_share=0.3,
        tenants_per_lane=1, length_scale=16, rng=random.Random(1),
    ) == []  # fmt: skip
