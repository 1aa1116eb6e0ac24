from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from filters.output_lengths import BUCKETS, Histogram, OutputLengths, bucket_of, upper_edge
from tests.filters.conftest import FakeClock


@given(st.integers(0, 2_000_000))
def test_a_length_lies_in_its_bucket(n: int) -> None:
    b = bucket_of(n)
    assert 0 <= b < BUCKETS
    assert n <= upper_edge(b)
    assert b == 0 or upper_edge(b - 1) < n
    assert upper_edge(b) <= max(n, math.ceil(n * 2 ** (1 / 8)))  # at most ~9% above


@settings(max_examples=200)
@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=300), st.floats(0.5, 0.999))
def test_the_quantile_is_never_below_the_sample_quantile(values: list[int], q: float) -> None:
    h = Histogram(0)
    for v in values:
        h.add(v)
    exact = sorted(values)[max(1, math.ceil(q * len(values))) - 1]
    got = h.quantile(q)
    assert exact <= got <= max(exact, math.ceil(exact * 2 ** (1 / 8)))


def test_tenant_then_pooled_prior_then_nothing() -> None:
    clock = FakeClock()
    lengths = OutputLengths(clock=clock, window=60.0)
    assert lengths.quantile("a", "m", 0.95, 5) == (0, "none")
    for n in range(1, 101):  # tenant a: 1..100 tokens
        lengths.observe("a", "m", n)
    assert lengths.quantile("a", "m", 0.95, 5) == (upper_edge(bucket_of(95)), "tenant")
    # b has no history of its own: the model's pooled lengths (every tenant's)
    lengths.observe("b", "m", 4000)
    tokens, source = lengths.quantile("b", "m", 0.5, 5)
    assert source == "pooled" and 50 <= tokens <= 56
    assert lengths.quantile("b", "other-model", 0.5, 5) == (0, "none")


def test_answers_older_than_two_windows_are_forgotten() -> None:
    clock = FakeClock()
    lengths = OutputLengths(clock=clock, window=60.0)
    for _ in range(30):
        lengths.observe("a", "m", 10)
    clock.now += 60.0  # the next window: the last one still counts
    assert lengths.quantile("a", "m", 0.9, 20) == (10, "tenant")
    for _ in range(30):
        lengths.observe("a", "m", 500)  # answers grew longer
    assert lengths.quantile("a", "m", 0.9, 20)[0] >= 500
    clock.now += 120.0
    assert lengths.quantile("a", "m", 0.9, 20) == (0, "none")


def test_the_table_is_bounded_and_a_new_window_length_starts_again() -> None:
    clock = FakeClock()
    lengths = OutputLengths(clock=clock, window=60.0, max_keys=10)
    for i in range(50):
        lengths.observe(f"t{i}", "m", 5)
    assert len(lengths._table) <= 10
    lengths.configure(60.0)
    assert lengths._table
    lengths.configure(30.0)
    assert not lengths._table
