"""Each replica's measured speed from its histogram sums: pages made by a fake replica whose
steps take known multiples of the profile's."""

from __future__ import annotations

import dataclasses

import pytest

from backends.profiles import get_profile
from controlplane.autoscale import ReplicaCounters, parse_counters
from controlplane.autoscale.rates import MEASURED, PROFILE, RateEstimator, Speed, pool_speed

SEED = get_profile("seed-2k")


class FakeReplica:
    """Cumulative counters of a replica whose decode steps take ``kd`` × the profile's and whose
    prefills take ``kp`` × (the model the estimator assumes: gaps and first tokens)."""

    def __init__(self, kd: float, kp: float) -> None:
        self.kd, self.kp = kd, kp
        self.c = ReplicaCounters()
        self.t = 0.0  # seconds: one per page

    def second(self, batch: int, first: int, uncached: int, cached: int = 0) -> ReplicaCounters:
        itl = SEED.itl_s(batch) * self.kd
        p = first * uncached / SEED.prefill_tok_s * self.kp  # this second's prefill time
        steps = max((1.0 - p) / itl, 0.0)
        gaps = batch * steps
        gap_s = gaps * itl + batch * p
        # prompts admitted together wait for each other: λ·(mean gap) others per request
        shared = 1.0 + first * gap_s / gaps
        self.t += 1.0
        c = self.c
        self.c = dataclasses.replace(
            c, running=float(batch),
            finished=c.finished + first, prompt=c.prompt + first * (uncached + cached),
            cached=c.cached + first * cached, generated=c.generated + gaps + first,
            itl_sum=c.itl_sum + gap_s, itl_count=c.itl_count + gaps,
            ttft_sum=c.ttft_sum + first * (0.01 + itl) + p * shared,
            ttft_count=c.ttft_count + first,
            queue_sum=c.queue_sum + first * 0.01, queue_count=c.queue_count + first,
        )  # fmt: skip
        return self.c


def _feed(est: RateEstimator, ep: str, rep: FakeReplica, seconds: int, start: int = 0) -> None:
    for t in range(start, start + seconds):
        b = 4 + (t % 5) * 6  # the batch varies, as it does under load
        est.observe(ep, rep.second(b, first=1 + t % 3, uncached=400, cached=100), SEED, rep.t)


@pytest.mark.parametrize(("kd", "kp"), [(1.0, 1.0), (2.0, 2.0), (1.5, 3.0), (0.5, 1.0)])
def test_recovers_decode_and_prefill_factors(kd: float, kp: float) -> None:
    est = RateEstimator(min_gaps=50, min_first=5)
    # the first page only starts the replica's history; the batch at each end of an interval is
    # the same here (the fake holds it for the second), so the model fits exactly
    rep = FakeReplica(kd, kp)
    for t in range(30):
        b = 4 + (t // 2 % 5) * 6
        est.observe("r", rep.second(b, first=1 + t % 3, uncached=400, cached=100), SEED, rep.t)
    s = est.speed("r")
    assert s.source == MEASURED
    assert s.decode == pytest.approx(kd, rel=0.15)
    assert s.prefill == pytest.approx(kp, rel=0.15)


def test_profile_until_enough_samples_then_measured_and_idle_keeps_it() -> None:
    est = RateEstimator(min_gaps=200, min_first=10)
    rep = FakeReplica(2.0, 2.0)
    assert est.speed("r", fallback=3.0) == Speed(3.0, 3.0, PROFILE)
    _feed(est, "r", rep, 3)  # a few seconds: too few first tokens
    s = est.speed("r", fallback=3.0)
    assert s.source == PROFILE and (s.decode, s.prefill) == (3.0, 3.0) and s.first < 10
    _feed(est, "r", rep, 20, start=3)
    measured = est.speed("r", fallback=3.0)
    assert measured.source == MEASURED and measured.decode == pytest.approx(2.0, rel=0.2)
    for _ in range(30):  # idle pages (nothing changes): the figures stay
        est.observe("r", rep.c, SEED, rep.t + 1)
    assert est.speed("r", fallback=3.0) == measured


def test_restart_starts_over_and_forget_drops() -> None:
    est = RateEstimator(min_gaps=50, min_first=5, keep=5)
    rep = FakeReplica(2.0, 2.0)
    _feed(est, "r", rep, 10)
    assert est.speed("r").source == MEASURED
    # the replica restarts as a fast one: counters fall to zero, no interval across the restart
    fresh = FakeReplica(1.0, 1.0)
    _feed(est, "r", fresh, 8)
    s = est.speed("r")
    assert s.decode == pytest.approx(1.0, rel=0.2)  # only the last `keep` intervals count
    est.forget(["other"])
    assert est.speed("r").source == PROFILE


def test_proportional_equations_give_one_factor() -> None:
    est = RateEstimator(min_gaps=1, min_first=1)
    # a page where every interval has the same gaps/first-token mix cannot tell decode from
    # prefill apart: one factor for both
    base = ReplicaCounters(finished=0, running=1, itl_count=0, ttft_count=0)
    est.observe("r", base, SEED, 0.0)
    itl = SEED.itl_s(1)
    p = 100 / SEED.prefill_tok_s
    page = dataclasses.replace(
        base, prompt=100, itl_count=1, itl_sum=2 * (itl + p), ttft_count=1, queue_count=1,
        ttft_sum=2 * (itl + p),
    )  # fmt: skip
    est.observe("r", page, SEED, 1000.0)  # one first token in 1000 s: no prompt shares a step
    s = est.speed("r")
    assert s.decode == s.prefill == pytest.approx(2.0, rel=1e-3)


def test_broken_pages_clamp_and_pool_speed_is_harmonic() -> None:
    est = RateEstimator(min_gaps=1, min_first=1)
    est.observe("r", ReplicaCounters(running=1), SEED, 0.0)
    huge = ReplicaCounters(running=1, prompt=10, itl_count=5, itl_sum=1e9, ttft_count=2,
                           ttft_sum=1e9, queue_count=2)  # fmt: skip
    est.observe("r", huge, SEED, 1.0)
    assert est.speed("r").decode == 50.0
    one, two = Speed(1.0, 1.0, MEASURED), Speed(2.0, 4.0, MEASURED)
    d, p, src = pool_speed([one, two])
    assert (d, p, src) == (pytest.approx(4 / 3), pytest.approx(8 / 5), MEASURED)
    assert pool_speed([], fallback=2.0) == (2.0, 2.0, PROFILE)
    assert pool_speed([Speed(2.0, 2.0, PROFILE)])[2] == PROFILE


def test_a_backlog_of_queue_times_does_not_bias_the_prefill_factor() -> None:
    """Requests admitted near the end of an interval get their first token in the next: a sum
    of queue times minus a sum of TTFTs would count a growing backlog (seconds each) against
    the prefill; per request means of the same interval do not."""
    est = RateEstimator(min_gaps=50, min_first=5)
    rep = FakeReplica(2.0, 2.0)
    c = rep.c
    for t in range(30):
        c = rep.second(4 + t % 3 * 6, first=2, uncached=400)
        # the queue grows: each second 2 more are admitted than got a first token, each having
        # waited 5 s; their first tokens come later (outside this window)
        c = dataclasses.replace(c, queue_count=c.queue_count + 2 * (t + 1),
                                queue_sum=c.queue_sum + 2 * (t + 1) * 5.0)  # fmt: skip
        est.observe("r", c, SEED, rep.t)
    s = est.speed("r")
    assert s.decode == pytest.approx(2.0, rel=0.2)
    assert s.prefill > 0.5  # not driven to the floor by the backlog


def test_histogram_sums_are_read_from_the_page() -> None:
    page = """
sglang:num_requests_total{model_name="m"} 3
sglang:inter_token_latency_seconds_bucket{le="0.1",model_name="m"} 7
sglang:inter_token_latency_seconds_sum{model_name="m"} 0.5
sglang:inter_token_latency_seconds_count{model_name="m"} 10
sglang:time_to_first_token_seconds_sum{model_name="m"} 0.3
sglang:time_to_first_token_seconds_count{model_name="m"} 3
sglang:queue_time_seconds_sum{model_name="m"} 0.1
sglang:queue_time_seconds_count{model_name="m"} 3
"""
    c = parse_counters(page)
    assert c is not None
    assert (c.itl_sum, c.itl_count, c.ttft_sum, c.ttft_count) == (0.5, 10.0, 0.3, 3.0)
    assert (c.queue_sum, c.queue_count) == (0.1, 3.0)
