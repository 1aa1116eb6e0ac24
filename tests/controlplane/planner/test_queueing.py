"""Queueing formulas against published values, identities, and a small simulation."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.errors import PlanInputError
from controlplane.planner.queueing import (
    allen_cunneen_factor,
    erlang_b,
    erlang_c,
    little_l,
    little_lambda,
    little_w,
    mgc_wait_mean,
    mmc_wait_mean,
    mmc_wait_quantile,
    solve_increasing,
)

# Published Erlang C values: ErlangC[3, 2] = 4/9 (Wolfram Language docs); M/M/2 at a = 1 is 1/3;
# standard call-centre Erlang C tables: a = 3 Erl on 5 agents 0.2362; a = 10 Erl on 11..14
# agents 0.6821, 0.4494, 0.2853, 0.1741.
PUBLISHED = [
    (3, 2.0, 4 / 9),
    (2, 1.0, 1 / 3),
    (5, 3.0, 0.2362),
    (11, 10.0, 0.6821),
    (12, 10.0, 0.4494),
    (13, 10.0, 0.2853),
    (14, 10.0, 0.1741),
]


@pytest.mark.parametrize(("c", "a", "expected"), PUBLISHED)
def test_erlang_c_matches_published_tables(c: int, a: float, expected: float) -> None:
    assert erlang_c(c, a) == pytest.approx(expected, abs=5e-5)


def test_erlang_b_published_value() -> None:
    # Erlang B table: 5 Erlangs on 10 lines blocks 1.84%
    assert erlang_b(10, 5.0) == pytest.approx(0.01838, abs=5e-5)
    assert erlang_b(1, 1.0) == pytest.approx(0.5)


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(rho=st.floats(0.01, 0.99))
def test_mm1_identities(rho: float) -> None:
    # M/M/1: P(wait) = ρ, Wq = ρ·S/(1 − ρ)
    assert erlang_c(1, rho) == pytest.approx(rho)
    assert mmc_wait_mean(rho, 1.0, 1) == pytest.approx(rho / (1 - rho))


def test_erlang_c_unstable_and_large_c() -> None:
    assert erlang_c(4, 4.0) == 1.0
    assert math.isinf(mmc_wait_mean(5.0, 1.0, 4))
    assert 0 < erlang_c(400, 380.0) < 1  # no overflow with hundreds of slots
    with pytest.raises(PlanInputError):
        erlang_c(0, 1.0)
    with pytest.raises(PlanInputError):
        erlang_c(3, -1.0)


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(
    lam=st.floats(0.01, 1000),
    w=st.floats(0.001, 100),
)
def test_littles_law_round_trips(lam: float, w: float) -> None:
    l_mean = little_l(lam, w)
    assert little_w(l_mean, lam) == pytest.approx(w)
    assert little_lambda(l_mean, w) == pytest.approx(lam)


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(c=st.integers(1, 60), rho=st.floats(0.05, 0.97), s=st.floats(0.01, 20))
def test_quantile_inverts_the_tail(c: int, rho: float, s: float) -> None:
    lam = rho * c / s
    q = 0.95
    t = mmc_wait_quantile(lam, s, c, q)
    pw = erlang_c(c, lam * s)
    tail = pw * math.exp(-(c / s - lam) * t)
    assert tail == pytest.approx(min(pw, 1 - q), rel=1e-9)


def test_allen_cunneen_reduces_to_mmc_for_exponential_service() -> None:
    assert allen_cunneen_factor(1.0, 1.0) == 1.0
    assert mgc_wait_mean(1.5, 1.0, 2, 1.0) == pytest.approx(mmc_wait_mean(1.5, 1.0, 2))
    assert mgc_wait_mean(1.5, 1.0, 2, 0.0) == pytest.approx(mmc_wait_mean(1.5, 1.0, 2) / 2)


def test_solve_increasing() -> None:
    assert solve_increasing(lambda x: x * x, 0.25, 0.0, 1.0) == pytest.approx(0.5, abs=1e-5)
    assert solve_increasing(lambda x: x, 2.0, 0.0, 1.0) is None
    assert solve_increasing(lambda x: x, -1.0, 0.0, 1.0) == 0.0


def _simulate_mmc(lam: float, s: float, c: int, n: int, seed: int) -> float:
    """Mean FCFS wait of n customers in an M/M/c queue (event-free: c server free times)."""
    rng = random.Random(seed)
    free = [0.0] * c
    heapq.heapify(free)
    t = total_wait = 0.0
    for _ in range(n):
        t += rng.expovariate(lam)
        start = max(t, heapq.heappop(free))
        total_wait += start - t
        heapq.heappush(free, start + rng.expovariate(1.0 / s))
    return total_wait / n


def test_erlang_c_wait_matches_a_simulated_queue() -> None:
    lam, s, c = 2.4, 1.0, 3  # ρ = 0.8
    simulated = _simulate_mmc(lam, s, c, 60_000, seed=7)
    assert simulated == pytest.approx(mmc_wait_mean(lam, s, c), rel=0.12)
