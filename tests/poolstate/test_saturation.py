"""Saturation, replica and pool states, hysteresis, and the JSON encoding (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poolstate import (
    SATURATED,
    Capacity,
    Hysteresis,
    PoolState,
    PoolStateDecodeError,
    ReplicaSample,
    ReplicaState,
    replica_saturation,
    replica_state,
    summarize_pool,
)

CAP = Capacity(max_running_requests=10, max_queued_requests=20, max_total_tokens=1000)
counts = st.integers(min_value=0, max_value=10_000)
samples = st.builds(
    ReplicaSample,
    running=counts,
    queued=counts,
    used_tokens=counts,
    token_usage=st.floats(0, 1),
    gen_throughput=st.floats(0, 1e5),
    cache_hit_rate=st.floats(0, 1),
)
caps = st.builds(
    Capacity,
    max_running_requests=st.none() | st.integers(1, 1000),
    max_queued_requests=st.none() | st.integers(1, 1000),
    max_total_tokens=st.none() | st.integers(1, 10**6),
)


def test_idle_busy_queued_and_full() -> None:
    assert replica_saturation(ReplicaSample(running=0, queued=0, used_tokens=0), CAP) == 0.0
    assert replica_saturation(ReplicaSample(running=5, queued=0, used_tokens=100), CAP) == 0.5
    assert replica_saturation(ReplicaSample(running=2, queued=0, used_tokens=900), CAP) == 0.9
    assert replica_saturation(ReplicaSample(running=10, queued=10, used_tokens=0), CAP) == 1.5
    assert replica_saturation(ReplicaSample(running=10, queued=20, used_tokens=0), CAP) == 2.0


def test_arrivals_the_free_slots_hold_are_no_queue() -> None:
    """A request caught in the scheduler's queue between two steps, with slots free, starts at
    the next step: it counts as running. Read as waiting (saturation past 1), it took a ladder
    step at 1.0 on an idle replica."""
    assert replica_saturation(ReplicaSample(running=3, queued=1, used_tokens=100), CAP) == 0.4
    assert replica_saturation(ReplicaSample(running=6, queued=4, used_tokens=0), CAP) == 1.0
    # more than the free slots hold: a queue
    assert replica_saturation(ReplicaSample(running=6, queued=5, used_tokens=0), CAP) == 1.25
    # free slots but KV full: a queue (waiting for memory)
    assert replica_saturation(ReplicaSample(running=2, queued=1, used_tokens=1000), CAP) == 1.05


def test_the_policy_capacity_wins_over_what_the_server_could_hold() -> None:
    # the server runs 16, the policy says 8 fit the latency budget: over capacity, > 1
    s = ReplicaSample(running=16, queued=0, used_tokens=0, max_total_tokens=10**6)
    assert replica_saturation(s, Capacity(max_running_requests=8)) == 2.0


def test_kv_usage_falls_back_to_the_token_usage_gauge() -> None:
    s = ReplicaSample(running=1, queued=0, token_usage=0.7)
    assert replica_saturation(s, Capacity(max_running_requests=100)) == 0.7


@given(samples, caps)
def test_saturation_is_finite_non_negative_and_past_one_while_requests_wait_for_a_slot(
    s: ReplicaSample, cap: Capacity
) -> None:
    x = replica_saturation(s, cap)
    assert 0.0 <= x < float("inf")
    slots = cap.max_running_requests
    if s.queued and (not slots or (s.running or 0) + s.queued > slots):
        assert x > 1.0


@given(samples, caps, counts)
def test_more_waiting_never_lowers_saturation(s: ReplicaSample, cap: Capacity, more: int) -> None:
    longer = ReplicaSample(s.running, (s.queued or 0) + more, s.used_tokens, s.token_usage)
    assert replica_saturation(longer, cap) >= replica_saturation(
        ReplicaSample(s.running, s.queued, s.used_tokens, s.token_usage), cap
    )


@given(samples, caps, st.floats(0, 100), st.floats(0.05, 10), st.booleans())
def test_stale_or_missing_data_reads_as_saturated(
    s: ReplicaSample, cap: Capacity, age: float, stale_after: float, answered: bool
) -> None:
    r = replica_state(s, cap, age_s=age, stale_after_s=stale_after, answered=answered)
    if age > stale_after:
        assert r.stale and r.saturation == SATURATED
    else:
        assert not r.stale and r.saturation == replica_saturation(s, cap)
    missing = replica_state(None, cap, age_s=0.0, stale_after_s=stale_after, answered=answered)
    assert missing.stale and missing.saturation == SATURATED


def test_an_incomplete_sample_is_stale() -> None:
    r = replica_state(ReplicaSample(token_usage=0.1), CAP, age_s=0, stale_after_s=1, answered=True)
    assert r.stale and r.saturation == SATURATED


@given(st.lists(st.floats(0, 3), max_size=60), st.floats(0.1, 2), st.floats(0, 0.09))
def test_hysteresis_flips_only_across_the_band(xs: list[float], hi: float, gap: float) -> None:
    h = Hysteresis(degrade_at=hi, recover_at=hi - gap - 0.01)
    marked = False
    for x in xs:
        nxt = h.next(marked, x)
        if nxt != marked:
            assert (x >= h.degrade_at) if nxt else (x <= h.recover_at)
        marked = nxt


def test_hysteresis_does_not_flap_on_noise_inside_the_band() -> None:
    h = Hysteresis(degrade_at=1.0, recover_at=0.8)
    marks, marked = [], False
    for x in [0.5, 1.0, 0.9, 0.95, 0.85, 0.99, 0.8, 0.9]:
        marked = h.next(marked, x)
        marks.append(marked)
    assert marks == [False, True, True, True, True, True, False, False]
    with pytest.raises(ValueError):
        Hysteresis(degrade_at=0.5, recover_at=0.5)


def test_pool_summary_counts_fresh_replicas_only() -> None:
    fresh = replica_state(
        ReplicaSample(running=4, queued=0, used_tokens=0),
        CAP,
        age_s=0,
        stale_after_s=1,
        answered=True,
    )
    stale = replica_state(None, CAP, age_s=5, stale_after_s=1, answered=False)
    pool = summarize_pool({"a:1": fresh, "b:2": stale}, {"a:1": CAP, "b:2": CAP})
    assert pool.capacity_running == 10 and pool.running == 4 and pool.free_running == 6
    assert pool.saturation == pytest.approx((0.4 + SATURATED) / 2)
    assert summarize_pool({}, {}).saturation == SATURATED


replica_states = st.builds(
    ReplicaState,
    saturation=st.floats(0, 5),
    running=counts,
    queued=counts,
    token_usage=st.floats(0, 1),
    gen_throughput=st.floats(0, 1e5),
    cache_hit_rate=st.floats(0, 1),
    healthy=st.booleans(),
    stale=st.booleans(),
    degraded=st.booleans(),
    age_s=st.floats(0, 1e4),
)
pool_states = st.builds(
    lambda version, ts, pools: PoolState(
        version=version,
        ts=ts,
        pools={
            name: summarize_pool(reps, {ep: CAP for ep in reps}) for name, reps in pools.items()
        },
    ),
    st.integers(0, 2**53),
    st.floats(0, 2e9),
    st.dictionaries(
        st.sampled_from(["chat", "code", "small"]),
        st.dictionaries(st.sampled_from(["127.0.0.1:1", "10.0.0.2:30000"]), replica_states),
    ),
)


@given(pool_states)
def test_json_round_trip_is_stable(state: PoolState) -> None:
    once = json.dumps(state.to_json(), sort_keys=True)
    again = PoolState.from_json(json.loads(once))
    assert json.dumps(again.to_json(), sort_keys=True) == once
    assert again.version == state.version and set(again.pools) == set(state.pools)


def test_the_state_is_immutable() -> None:
    state = PoolState(version=1, pools={"chat": summarize_pool({}, {})})
    with pytest.raises(TypeError):
        state.pools["x"] = state.pools["chat"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        state.version = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "doc",
    [[], {"version": "1", "ts": 0, "pools": {}}, {"version": 1, "ts": 0},
     {"version": 1, "ts": 0, "pools": {"a": {"endpoints": {"x": {"s": 1}}}}}],
)  # fmt: skip
def test_a_wrong_shape_is_a_decode_error(doc: object) -> None:
    with pytest.raises(PoolStateDecodeError):
        PoolState.from_json(doc)
