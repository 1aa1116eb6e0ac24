"""The picker's latency model: each replica's TTFT against the prefill work ahead of a request,
learned online (recursive least squares with forgetting)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.plugins.picker.latency import LatencyModel


def _feed(
    model: LatencyModel,
    replica: str,
    base: float,
    per_k: float,
    n: int,
    rng: random.Random,
    noise: float = 0.05,
) -> None:
    for _ in range(n):
        work = rng.randrange(0, 20_000)
        ttft = (base + per_k * work / 1000) * (1 + rng.uniform(-noise, noise))
        model.observe(replica, work, ttft)


@settings(max_examples=40, deadline=None)
@given(
    base=st.floats(0.001, 0.2),
    per_k=st.floats(0.001, 0.5),
    seed=st.integers(0, 2**16),
)
def test_it_learns_a_replicas_base_and_prefill_rate(base: float, per_k: float, seed: int) -> None:
    model = LatencyModel()
    _feed(model, "a", base, per_k, 200, random.Random(seed))
    for work in (1_000, 8_000, 16_000):  # inside what it saw; 5% noise on each observation
        truth = base + per_k * work / 1000
        predicted = model.predict("a", work)
        assert predicted is not None
        # 5% noise at the largest work blurs the base by about 1% of the largest TTFT
        assert predicted == pytest.approx(truth, rel=0.1, abs=0.02 * (base + per_k * 20))


def test_nothing_is_predicted_before_enough_is_seen() -> None:
    model = LatencyModel(min_count=8)
    _feed(model, "a", 0.02, 0.05, 7, random.Random(1))
    assert model.predict("a", 1000) is None
    _feed(model, "a", 0.02, 0.05, 1, random.Random(2))
    assert model.predict("a", 1000) is not None


def test_a_new_replica_borrows_the_pools_fit_until_it_has_its_own() -> None:
    model = LatencyModel()
    rng = random.Random(3)
    _feed(model, "a", 0.02, 0.10, 100, rng)
    pooled = model.predict("b", 10_000)
    assert pooled == pytest.approx(0.02 + 1.0, rel=0.15)
    _feed(model, "b", 0.02, 0.30, 100, rng)  # b is three times slower: its own fit wins
    assert model.predict("b", 10_000) == pytest.approx(0.02 + 3.0, rel=0.15)
    assert model.predict("a", 10_000) == pytest.approx(0.02 + 1.0, rel=0.15)


def test_a_replica_that_slows_down_is_followed_within_tens_of_requests() -> None:
    model = LatencyModel()
    rng = random.Random(4)
    _feed(model, "a", 0.02, 0.05, 300, rng)
    _feed(model, "a", 0.02, 0.20, 100, rng)  # a longer running batch: 4x slower prefill
    assert model.predict("a", 10_000) == pytest.approx(0.02 + 2.0, rel=0.15)


def test_nonsense_observations_are_ignored_and_predictions_never_negative() -> None:
    model = LatencyModel(min_count=1)
    model.observe("a", -5, 0.1)
    model.observe("a", 5, -0.1)
    assert model.predict("a", 10) is None
    model.observe("a", 0, 0.0)
    predicted = model.predict("a", 10_000)
    assert predicted is not None and predicted >= 0.0
    with pytest.raises(ValueError, match="forget"):
        LatencyModel(forget=0.1)
