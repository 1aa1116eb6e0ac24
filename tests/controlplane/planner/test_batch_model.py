"""The batch-aware chain: reduces to M/M/c and to processor sharing where it must."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.batch_model import _tail_uniform_plus_wait, batch_predict, batch_queue
from controlplane.planner.queueing import erlang_c, mmc_wait_mean, mmc_wait_quantile


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(c=st.integers(1, 80), rho=st.floats(0.05, 0.97), s=st.floats(0.05, 30))
def test_constant_service_time_is_mmc(c: int, rho: float, s: float) -> None:
    lam = rho * c / s
    bq = batch_queue(lam, c, lambda _k: s)
    assert bq.p_wait == pytest.approx(erlang_c(c, lam * s), rel=1e-7, abs=1e-12)
    assert bq.mean_wait_s == pytest.approx(mmc_wait_mean(lam, s, c), rel=1e-7, abs=1e-12)
    assert bq.wait_quantile(0.95) == pytest.approx(
        mmc_wait_quantile(lam, s, c, 0.95), rel=1e-6, abs=1e-9
    )
    # Little's law on the running requests: L_run = λ·S
    assert bq.mean_running == pytest.approx(lam * s, rel=1e-7)


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(rho=st.floats(0.05, 0.95))
def test_flat_throughput_is_processor_sharing(rho: float) -> None:
    # itl(b) = b/T, no prefill: departures at T/out whatever the batch → M/M/1-PS, L = ρ/(1 − ρ)
    t_tok, out, c = 2000.0, 500.0, 400
    lam = rho * t_tok / out
    bq = batch_queue(lam, c, lambda k: out * k / t_tok)
    assert bq.mean_in_system == pytest.approx(rho / (1 - rho), rel=1e-6)


def test_unstable_and_idle() -> None:
    bq = batch_queue(10.0, 4, lambda _k: 1.0)
    assert bq.p_wait == 1.0 and math.isinf(bq.mean_wait_s) and math.isinf(bq.wait_quantile(0.9))
    idle = batch_queue(0.0, 4, lambda _k: 1.0)
    assert idle.mean_wait_s == 0.0 and idle.wait_quantile(0.95) == 0.0


def test_batching_waits_less_than_mmc_when_small_batches_run_faster() -> None:
    # S(k) grows with k: at the same λ, fewer requests hold slots than M/M/c with S(c) says
    c, s_full = 40, 10.1
    lam = 0.8 * c / s_full
    bq = batch_queue(lam, c, lambda k: 0.1 + 500 * (0.01 + 0.00025 * k))
    assert bq.mean_in_system < lam * s_full
    assert bq.mean_wait_s < mmc_wait_mean(lam, s_full, c)


def test_step_residual_alone_is_uniform_over_the_step() -> None:
    # many slots, light load: nobody waits for a slot, everyone waits for the step to end
    bp = batch_predict(0.5, 400, 10.0, lambda _k: 0.02, 0.0)
    assert bp.queue.p_wait < 1e-12
    busy = 1 - bp.queue.p_idle
    assert bp.residual.mean_s == pytest.approx(busy * 0.01, rel=1e-6)
    # P(R > t) = busy·(1 − t/d): the p95 is d·(1 − 0.05/busy)
    assert bp.wait_quantile(0.95) == pytest.approx(0.02 * (1 - 0.05 / busy), rel=1e-6)


@settings(deadline=None)  # timing is not under test; a loaded machine must not fail it
@given(
    length=st.floats(0.001, 0.1),
    p_wait=st.floats(0.0, 1.0),
    theta=st.floats(0.5, 200.0),
    t=st.floats(0.0, 0.3),
)
def test_uniform_plus_exponential_tail_is_a_probability_and_continuous(
    length: float, p_wait: float, theta: float, t: float
) -> None:
    tail = _tail_uniform_plus_wait(t, length, p_wait, theta)
    assert -1e-12 <= tail <= 1 + 1e-12
    below = _tail_uniform_plus_wait(length * (1 - 1e-9), length, p_wait, theta)
    above = _tail_uniform_plus_wait(length * (1 + 1e-9), length, p_wait, theta)
    assert below == pytest.approx(above, abs=1e-6)


def test_uniform_plus_exponential_tail_matches_sampling() -> None:
    rng = random.Random(3)
    length, p_wait, theta, n = 0.02, 0.3, 40.0, 200_000
    samples = [
        rng.uniform(0, length) + (rng.expovariate(theta) if rng.random() < p_wait else 0.0)
        for _ in range(n)
    ]
    for t in (0.005, 0.02, 0.05):
        empirical = sum(x > t for x in samples) / n
        assert _tail_uniform_plus_wait(t, length, p_wait, theta) == pytest.approx(
            empirical, abs=0.005
        )


def test_prefill_share_slows_decoding() -> None:
    # a tenth of the time prefilling: every request holds its slot 1/(1 − 0.1) longer
    slow = batch_predict(4.0, 40, 100.0, lambda _k: 0.01, 0.025)
    fast = batch_predict(4.0, 40, 100.0, lambda _k: 0.01, 0.0)
    assert slow.queue.mean_running == pytest.approx(fast.queue.mean_running / 0.9, rel=1e-6)
    assert math.isinf(batch_predict(50.0, 40, 100.0, lambda _k: 0.01, 0.025).mean_wait_s)
