"""The gateway comparison's workload (bench/peers_workload.py): trace lengths, tier mix, budgets."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from overload_workload import load_sample, scaled_lengths
from peers_workload import (
    TIERS,
    Tier,
    budget_outcome,
    build_requests,
    chat_body,
    mean_tokens,
    percentile,
    tenant_keys,
)


def test_requests_follow_the_tier_shares_and_the_trace_lengths() -> None:
    records = load_sample()
    reqs = build_requests(records, 3000, length_scale=16, rng=random.Random(1))
    tiers = Counter(r.tier for r in reqs)
    for t in TIERS:
        assert abs(tiers[t.name] / len(reqs) - t.share) < 0.04, (t, tiers)
    keys = tenant_keys()
    assert all(r.key in keys[r.tier] for r in reqs)
    assert {r.key for r in reqs if r.tier == "free"} == set(keys["free"])  # every tenant used
    lengths = {scaled_lengths(rec, 16) for rec in records}
    assert all((r.prompt_tokens, r.max_tokens) in lengths for r in reqs)
    assert len({r.prompt for r in reqs[: len(records)]}) > 0.9 * len(records)  # no early repeats
    assert len(reqs[0].prompt.split()) == reqs[0].prompt_tokens  # one token per word


def test_requests_are_reproducible_from_the_seed() -> None:
    records = load_sample()[:50]
    a = build_requests(records, 40, length_scale=32, rng=random.Random(7))
    b = build_requests(records, 40, length_scale=32, rng=random.Random(7))
    c = build_requests(records, 40, length_scale=32, rng=random.Random(8))
    assert a == b and a != c


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="no trace records"):
        build_requests([], 1, length_scale=16, rng=random.Random(1))
    with pytest.raises(ValueError, match="positive total share"):
        build_requests(load_sample()[:2], 1, length_scale=16, rng=random.Random(1),
                       tiers=(Tier("x", 0.0, 1),))  # fmt: skip
    with pytest.raises(ValueError):
        budget_outcome(-1, 0, 0, 0)
    with pytest.raises(ValueError):
        mean_tokens([])


def test_chat_body_streams_with_usage() -> None:
    req = build_requests(load_sample()[:3], 1, length_scale=16, rng=random.Random(2))[0]
    body = chat_body(req, "m")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == req.max_tokens
    assert mean_tokens([req]) == req.prompt_tokens + req.max_tokens
    plain = chat_body(req, "m", stream=False)
    assert "stream" not in plain and "stream_options" not in plain
    assert plain["messages"] == body["messages"] and plain["max_tokens"] == req.max_tokens


def test_budget_outcome_counts_the_refill_and_the_overshoot() -> None:
    held = budget_outcome(1000, 10, 5, 1050)
    assert held.allowed == 1050 and held.held and held.overshoot == 0
    over = budget_outcome(1000, 10, 5, 1575)
    assert not over.held and over.overshoot == 525 and over.overshoot_ratio == pytest.approx(0.5)


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
