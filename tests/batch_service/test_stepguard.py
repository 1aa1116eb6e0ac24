"""The step guard's arithmetic: how many batch streams a replica may carry beside interactive
ones so that its measured decode step grows by at most ``max_increase``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from batch_service.pacer import Pacer, PoolView
from batch_service.stepguard import Quiet, StepGuard, StepReading
from batch_service.stepmeter import parse_step_reading


def feed(
    g: StepGuard,
    ep: str,
    streams: Sequence[float],
    step: Callable[[float], float],
    noise: float = 0.0,
) -> None:
    """A replica running ``streams[k]`` for one second each, its gaps as ``step(b)`` says."""
    rnd = random.Random(1)
    gaps_s = gaps = 0.0
    g.observe(ep, StepReading(0.0, 0.0, 0.0))
    for t, b in enumerate(streams, start=1):
        s = step(b) * (1 + rnd.uniform(-noise, noise))
        n = b / s  # gaps in one second: b per step of s
        gaps, gaps_s = gaps + n, gaps_s + n * s
        g.observe(ep, StepReading(gaps_s, gaps, float(t)))


def seed2k(b: float) -> float:
    """About the emulator's ``seed-2k``: 10.3 ms at 2 streams, ~28 ms at 60."""
    return 0.0097 + 0.000305 * b


def test_no_measure_yet_is_the_proportional_bound() -> None:
    g = StepGuard(0.1)
    # steps as long as their stream count: 10% more step is 10% more streams
    assert g.streams("r1", interactive=20) == 2
    assert g.streams("r1", interactive=0) == 0  # an arriving request counts as one stream
    assert StepGuard(1.0).streams("r1", interactive=3) == 3


def test_a_line_fitted_over_two_loads_gives_the_streams_within_the_budget() -> None:
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    fit = g.fit("r1")
    assert fit is not None
    assert fit.slope == pytest.approx(0.000305, rel=0.01)
    # with 4 interactive streams the step is 10.9 ms; 10% of it is 1.09 ms = 3.6 streams
    assert g.streams("r1", interactive=4) == 3
    # half the step added: 17 streams; a doubled step: 35
    half, double = StepGuard(0.5), StepGuard(1.0)
    for x in (half, double):
        feed(x, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    assert half.streams("r1", 4) == 17
    assert double.streams("r1", 4) == 35
    # a step that does not grow with streams costs interactive nothing: the slots decide
    flat = StepGuard(0.1)
    feed(flat, "r1", [2, 60, 4, 58] * 4, lambda b: 0.01)
    assert flat.streams("r1", 4) >= 2**31


def test_a_noisy_or_narrow_fit_takes_the_safe_side() -> None:
    """The slope used is an upper bound (fit + 2 standard errors), never above the
    proportional bound: few or scattered intervals allow fewer streams, never more."""
    clean, noisy = StepGuard(0.1), StepGuard(0.1)
    loads = [2, 60, 4, 58, 3, 61, 2, 60] * 4
    feed(clean, "r1", loads, seed2k)
    feed(noisy, "r1", loads, seed2k, noise=0.3)
    assert noisy.streams("r1", 4) <= clean.streams("r1", 4)
    # every interval at the same load: no slope can be read, the proportional bound stands
    narrow = StepGuard(0.1)
    feed(narrow, "r1", [60] * 20, seed2k)
    fit = narrow.fit("r1")
    assert fit is not None and fit.slope == pytest.approx(seed2k(60) / 60)
    assert narrow.streams("r1", 4) == 0  # 10% of 4 streams' proportional step


def test_the_pool_cap_sums_the_replicas_and_spreads_interactive_evenly() -> None:
    g = StepGuard(0.1)
    for ep in ("r1", "r2"):
        feed(g, ep, [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    # 8 interactive streams over two replicas: 4 each, 3 batch streams each
    assert g.cap(["r1", "r2"], interactive=8) == 6
    assert g.cap([], interactive=8) == 0
    # a replica that left the pool takes its measure along
    g.forget(["r1"])
    assert g.fit("r2") is None and g.fit("r1") is not None


def test_a_restart_or_an_idle_interval_adds_nothing() -> None:
    g = StepGuard(0.1)
    g.observe("r1", StepReading(10.0, 1000.0, 0.0))
    g.observe("r1", StepReading(10.0, 1000.0, 1.0))  # idle: no gaps
    g.observe("r1", StepReading(0.1, 10.0, 2.0))  # counters went back: restarted
    assert g.fit("r1") is None
    g.observe("r1", StepReading(0.3, 30.0, 3.0))  # 0.2 s of gaps in 1 s, 10 ms each
    fit = g.fit("r1")
    assert fit is not None and fit.intervals == 1
    assert fit.slope == pytest.approx(0.01 / 0.2)  # one interval: the proportional bound


def test_parse_step_reading_sums_ranks_and_refuses_other_pages() -> None:
    text = (
        "# TYPE sglang:inter_token_latency_seconds histogram\n"
        'sglang:inter_token_latency_seconds_bucket{model_name="m",le="0.1"} 5\n'
        'sglang:inter_token_latency_seconds_sum{model_name="m",dp="0"} 1.5\n'
        'sglang:inter_token_latency_seconds_sum{model_name="m",dp="1"} 0.5\n'
        'sglang:inter_token_latency_seconds_count{model_name="m",dp="0"} 100\n'
        'sglang:inter_token_latency_seconds_count{model_name="m",dp="1"} 50\n'
        'sglang:inter_token_latency_seconds_count{model_name="m",dp="2"} NaN\n'
    )
    assert parse_step_reading(text, 5.0) == StepReading(2.0, 150.0, 5.0)
    assert parse_step_reading("vllm:num_requests_running 3\n", 5.0) is None


def test_the_pacer_holds_batch_to_the_guard_while_interactive_is_active() -> None:
    """The pool has 60 idle slots; the guard allows 3 batch streams beside 4 interactive ones.
    Without interactive (no sample of it within ``trend``), the slots decide."""
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    p = Pacer(max_concurrency=128, fill=0.95, backoff=1.0, guard=g)
    eps = ("r1",)
    assert p.window(PoolView(64, 4, 0.1, version=1, endpoints=eps), ours=0, now=0.0) == 3
    assert p.cap == 3
    # interactive gone, and its last sample older than ``trend``: the batch fills the room
    idle = Pacer(max_concurrency=128, fill=0.95, backoff=1.0, guard=g)
    assert idle.window(PoolView(64, 0, 0.0, version=1, endpoints=eps), ours=0, now=0.0) == 60
    assert idle.cap is None
    # interactive arrives while 60 batch lines run: the window is cut at once to the cap
    w = idle.window(PoolView(64, 64, 1.0, version=2, endpoints=eps), ours=60, now=0.3)
    assert idle.cap == 3 and w <= 3
    # the pacer without a guard keeps the slots' window beside the same interactive load
    plain = Pacer(max_concurrency=128, fill=0.95, backoff=1.0)
    assert plain.window(PoolView(64, 4, 0.1, version=1, endpoints=eps), ours=0, now=0.0) == 57


def test_hours_at_one_load_keep_what_another_load_measured() -> None:
    """The batch capped beside busy interactive traffic for a long time: the intervals of the
    last idle spell (60 streams) stay, so the slope stays measured rather than falling back."""
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4 + [6, 7] * 2000, seed2k)
    fit = g.fit("r1")
    assert fit is not None and fit.slope == pytest.approx(0.000305, rel=0.05)
    assert g.streams("r1", interactive=4) == 3


def test_a_full_batch_does_not_hide_interactive_requests_from_the_guard() -> None:
    """Lines in flight are not all at the replica: ~1/6 of a full window is in the gateway.
    Subtracting every line in flight from the replica's count hid that many interactive
    requests (``others`` read 0 beside 5 interactive ones) and the guard let go; the share of
    our lines not at the replica, read while interactive is idle, uncovers them."""
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, guard=g, lag=0.0)
    eps = ("r1",)
    v = 0
    for t in range(12):  # idle: 60 lines in flight, 50 at the replica
        v += 1
        p.window(PoolView(64, 50, 0.8, version=v, endpoints=eps), ours=60, now=t * 0.25)
    assert p.cap is None  # interactive idle: the slots decide
    # five interactive requests arrive: the replica runs 55, still fewer than our 60 lines
    w = p.window(PoolView(64, 55, 0.9, version=v + 1, endpoints=eps), ours=60, now=3.25)
    assert p.cap is not None and p.cap <= 4
    assert w <= p.cap + 10  # cut at once to the cap and the lines in the gateway


def test_the_guard_lets_go_only_after_a_lull_long_for_the_interactive_rate() -> None:
    """A lull of ``trend`` seconds at 0.5 arrivals a second is no lull: a batch filling the
    slots then meets the next arrival (a gap that long comes before 37% of arrivals). The
    guard waits ``ln 20 / λ`` (6 s here: one arrival in 20); with no arrivals, ``trend``."""
    q = Quiet(trend=2.0, window=60.0)
    t = 0.0
    for _ in range(30):  # one arrival every 2 s, each seen in one sample
        q.observe(t, 1)
        q.observe(t + 0.25, 0)
        t += 2.0
    assert q.rate(t) == pytest.approx(0.5, rel=0.05)
    assert q.hold(t) == pytest.approx(math.log(20) / 0.5, rel=0.05)
    last = t - 2.0  # the last sample with interactive work
    assert not q.quiet(last + 3.0)
    assert q.quiet(last + 6.5)
    # no interactive at all: quiet from the start (the slots decide at once)
    fresh = Quiet(trend=2.0)
    fresh.observe(0.0, 0)
    assert fresh.quiet(0.0) and fresh.hold(0.0) == 2.0


def test_the_share_in_the_gateway_is_not_read_while_a_window_opens() -> None:
    """Lines just sent are not in the sample yet: read then, nearly all our lines look like
    they are in the gateway, and every request at the replicas would read as interactive."""
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, guard=g, lag=0.0)
    eps = ("r1",)
    for v, ours in enumerate((16, 32, 48, 60), start=1):  # opening: the replica shows none
        p.window(PoolView(64, 0, 0.0, version=v, endpoints=eps), ours=ours, now=v * 0.25)
    for v in range(5, 17):  # steady: 60 in flight, 50 at the replica
        p.window(PoolView(64, 50, 0.8, version=v, endpoints=eps), ours=60, now=v * 0.25 + 2.0)
    p.window(PoolView(64, 50, 0.8, version=17, endpoints=eps), ours=60, now=6.5)
    assert p.cap is None and p.interactive <= 1  # the share is ~1/6, not ~1


def light_interactive(p: Pacer, *, decodes: bool, seconds: float = 120.0) -> list[int]:
    """The windows of a job beside light interactive traffic on 3 idle replicas that were never
    measured (no token gaps seen: an embeddings pool, or none decoded yet): one interactive
    request at the replicas for one sample every 5 s; the job's lines are not at the replicas
    (each one's work there is over within a sample)."""
    eps = ("r1", "r2", "r3")
    windows, v, t = [], 0, 0.0
    while t < seconds:
        v += 1
        busy = 1 if v % 20 == 1 else 0
        pool = PoolView(768, busy, busy / 768, version=v, endpoints=eps)
        windows.append(p.window(pool, ours=0, now=t, decodes=decodes))
        t += 0.25
    return windows


def test_a_job_whose_lines_decode_nothing_is_not_held_by_the_guard() -> None:
    """The guard caps batch *streams* by the decode step they add; an embeddings line is one
    prefill and decodes nothing, and no embeddings request ever adds a token gap to measure.
    Applied to such a job, the unmeasured bound (``⌊0.1 · i⌋``: 0 beside fewer than 10
    interactive streams a replica) held its window at 0 for as long as any interactive request
    came within ``ln 20 / λ`` of the last (a hold that grows with every arrival it counts):
    the batch stopped with lines left."""
    chat = light_interactive(Pacer(128, 0.95, 0.2, guard=StepGuard(0.1)), decodes=True)
    assert max(chat[8:]) == 0  # a decoding job beside unmeasured replicas: the guard holds it
    p = Pacer(128, 0.95, 0.2, guard=StepGuard(0.1))
    emb = light_interactive(p, decodes=False)
    assert min(emb) >= 100 and p.cap is None  # the slots decide (768 idle)


def test_the_lines_at_the_replicas_the_ladder_leaves_out() -> None:
    """What the runner publishes for the degradation ladder and the planner
    (poolstate/valley.py): its lines in flight less the share measured in the gateway (~1/6
    here: 50 of 60 at the replica); every line before a share is measured."""
    g = StepGuard(0.1)
    feed(g, "r1", [2, 60, 4, 58, 3, 61, 2, 60] * 4, seed2k)
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, guard=g, lag=0.5)
    assert p.at_replicas(0) == 0
    eps = ("r1",)
    p.window(PoolView(64, 0, 0.0, version=1, endpoints=eps), ours=60, now=0.0)
    assert p.at_replicas(60) == 60  # no share measured yet: every line counts
    for v in range(2, 20):  # steady and idle: 60 in flight, 50 at the replica
        p.window(PoolView(64, 50, 0.8, version=v, endpoints=eps), ours=60, now=v * 0.25)
    assert p.at_replicas(60) == 50
    assert p.at_replicas(30) == 25
