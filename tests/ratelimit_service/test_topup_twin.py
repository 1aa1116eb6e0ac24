"""``quota/topup.lua`` and its pure-Python twin reach identical grants when driven with
the same random reserves, top-ups and settles against a real redis-server, and a top-up grants
exactly what every enforced limit still holds (the in-stream stop's 0 overshoot)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.topup import NO_RECORD, TOPUP_LUA, TopUp, topup
from quota.windows import window
from ratelimit_service.limiter import Check, MemoryState, reserve, settle
from ratelimit_service.store import load_script, reserve_args

TTL_MS = 10**12
RATES = [0.0, 0.5, 3.0, 7.25, 100.0, 1234.5678]


@pytest.fixture(scope="module")
def client(redis_port: int) -> Iterator[redis.Redis]:
    c = redis.Redis(port=redis_port)
    yield c
    c.close()


# (unit, limit, rate, shadow, money); windows never roll over inside an example (see _start)
limit_st = st.one_of(
    st.tuples(st.just("bucket"), st.integers(1, 2000), st.sampled_from(RATES), st.booleans(),
              st.just(False)),
    st.tuples(st.sampled_from(["hour", "day", "month"]), st.integers(1, 3000), st.just(0.0),
              st.booleans(), st.booleans()),
)  # fmt: skip
op_st = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 1),
              st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
              st.integers(0, 2500), st.integers(0, 2)),
    st.tuples(st.just("topup"), st.integers(0, 1), st.integers(0, 2), st.integers(1, 3000),
              st.sampled_from([0, 1, 7, 1500, 60000])),
    st.tuples(st.just("settle"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3000)),
    st.tuples(st.just("advance"), st.integers(0, 3_000_000)),
)  # fmt: skip


def _start() -> int:
    """Two days ahead of the wall clock (Redis expires keys on it), one minute into a UTC day:
    an example's advances (at most 3 minutes) never cross an hour, so no window rolls over."""
    day = 86400 * 1_000_000
    return (int(time.time() * 1e6) // day + 2) * day + 60_000_000


def _checks(prefix: str, limits: list[tuple], which: list[int], cost: int, now: int) -> list[Check]:
    out = []
    for i in which:
        unit, lim, rate, shadow, money = limits[i]
        if unit == "bucket":
            out.append(Check(f"{prefix}:b:{i}", "b", cost, lim, rate, 0, shadow, True))
        else:
            idx, reset = window(unit, now)
            c = cost * 3 if money else cost
            key = f"{prefix}:w:{i}:{idx}"
            out.append(Check(key, "w", c, lim, 0.0, reset, shadow, True, money))
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limits=st.lists(limit_st, min_size=4, max_size=4),
    first=st.lists(st.integers(0, 1500), min_size=6, max_size=6),
    ops=st.lists(op_st, min_size=1, max_size=60),
)
def test_topup_lua_and_twin_agree(
    client: redis.Redis, limits: list[tuple], first: list[int], ops: list[tuple]
) -> None:
    sha = {n: client.script_load(load_script(n)) for n in ("reserve", "settle")}
    sha["topup"] = client.script_load(TOPUP_LUA)
    run = uuid.uuid4().hex[:8]
    state = MemoryState()
    now = _start()
    # every request starts with a reservation (over all four limits), then anything may happen
    opening = [("reserve", i % 2, [0, 1, 2, 3], cost, i // 2) for i, cost in enumerate(first)]
    for op in [*opening, *ops]:
        if op[0] == "advance":
            now += op[1]
            continue
        subject = f"tw:{{u{run}-{op[1]}}}"
        if op[0] == "reserve":
            _, _, which, cost, rid = op
            record = f"{subject}:r:{rid}"
            checks = _checks(subject, limits, which, cost, now)
            want = reserve(state, record, checks, now, TTL_MS)
            keys, args = reserve_args(record, True, checks, now, TTL_MS)
            raw = client.evalsha(sha["reserve"], len(keys), *keys, *args)
            assert bool(raw[0]) == want.admitted
        elif op[0] == "topup":
            _, _, rid, ask, p1k = op
            record = f"{subject}:r:{rid}"
            want_t = topup(state, record, ask, now, p1k)
            raw = client.evalsha(sha["topup"], 1, record, now, ask, p1k)
            assert TopUp(int(raw[0]), int(raw[1])) == want_t
            assert want_t.granted <= ask
        else:
            _, _, rid, actual = op
            record = f"{subject}:r:{rid}"
            want_s = settle(state, record, actual, now)
            raw = client.evalsha(sha["settle"], 1, record, now, actual)
            assert (bool(raw[0]), int(raw[1])) == (want_s.found, want_s.delta)


def test_topup_grants_what_the_bucket_holds_then_refuses(client: redis.Redis) -> None:
    """A reservation of 600 from a 1,000-token bucket: the top-ups grant 256, then the 144 left,
    then nothing; settle compares the real cost with all 1,000 tokens charged."""
    sha_r = client.script_load(load_script("reserve"))
    sha_s = client.script_load(load_script("settle"))
    sha_t = client.script_load(TOPUP_LUA)
    subject = f"tw:{{stop-{uuid.uuid4().hex[:8]}}}"
    record, bucket = f"{subject}:r:1", f"{subject}:b:tokens"
    now = int(time.time() * 1e6)
    checks = [Check(bucket, "b", 600, 1000, 0.0, 0, False, True)]
    keys, args = reserve_args(record, True, checks, now, 60_000)
    assert client.evalsha(sha_r, len(keys), *keys, *args)[0] == 1
    assert client.evalsha(sha_t, 1, record, now, 256, 0) == [1, 256]
    assert client.evalsha(sha_t, 1, record, now, 256, 0) == [1, 144]
    assert client.evalsha(sha_t, 1, record, now, 256, 0) == [0, 0]
    assert float(client.hget(bucket, "tk")) == 0.0
    assert client.evalsha(sha_s, 1, record, now, 1000) == [1, 0, None]  # 1000 real, 1000 charged
    assert client.evalsha(sha_t, 1, record, now, 256, 0) == [NO_RECORD, 0]  # settled: gone


def test_shadow_limit_never_refuses_a_topup(client: redis.Redis) -> None:
    sha_r = client.script_load(load_script("reserve"))
    sha_t = client.script_load(TOPUP_LUA)
    subject = f"tw:{{shadow-{uuid.uuid4().hex[:8]}}}"
    now = int(time.time() * 1e6)
    checks = [
        Check(f"{subject}:b:tokens", "b", 100, 10_000, 0.0, 0, False, True),
        Check(f"{subject}:b:lane", "b", 100, 150, 0.0, 0, True, True),  # shadow, nearly spent
    ]
    keys, args = reserve_args(f"{subject}:r:1", True, checks, now, 60_000)
    client.evalsha(sha_r, len(keys), *keys, *args)
    assert client.evalsha(sha_t, 1, f"{subject}:r:1", now, 200, 0) == [1, 200]
    assert float(client.hget(f"{subject}:b:lane", "tk")) == 50.0  # could not take 200: untouched


@pytest.mark.parametrize("money", [False, True])
def test_a_window_limit_binds_in_lua_and_twin(client: redis.Redis, money: bool) -> None:
    """A day window (tokens, or micro-USD at 1,500 per 1,000 tokens) with 400 tokens' worth left
    grants 400 of 1,000 asked, in Redis and in the twin alike."""
    sha_r = client.script_load(load_script("reserve"))
    sha_t = client.script_load(TOPUP_LUA)
    subject = f"tw:{{win-{uuid.uuid4().hex[:8]}}}"
    now = _start()
    idx, reset = window("day", now)
    limit, cost, p1k = (1500, 900, 1500) if money else (1000, 600, 0)
    checks = [
        Check(f"{subject}:b:tokens", "b", 600, 100_000, 0.0, 0, False, True),
        Check(f"{subject}:w:day:{idx}", "w", cost, limit, 0.0, reset, False, True, money),
    ]
    state = MemoryState()
    record = f"{subject}:r:1"
    reserve(state, record, checks, now, TTL_MS)
    keys, args = reserve_args(record, True, checks, now, TTL_MS)
    client.evalsha(sha_r, len(keys), *keys, *args)
    raw = client.evalsha(sha_t, 1, record, now, 1000, p1k)
    assert raw == [1, 400]
    assert topup(state, record, 1000, now, p1k) == TopUp(1, 400)
    assert int(client.get(f"{subject}:w:day:{idx}")) == limit
    assert client.evalsha(sha_t, 1, record, now, 1000, p1k) == [0, 0]
