"""The Lua scripts and their pure-Python twin reach identical decisions and remaining counts when
driven with the same random sequences against a real redis-server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.windows import window
from ratelimit_service.limiter import Check, MemoryState, reserve, settle
from ratelimit_service.store import load_script, reserve_args

TTL_MS = 10**12  # reservations never expire within an example (Redis runs on the wall clock)
RATES = [0.0, 0.5, 3.0, 7.25, 100.0, 1234.5678, 1e4]


@pytest.fixture(scope="module")
def client(redis_port: int) -> Iterator[redis.Redis]:
    c = redis.Redis(port=redis_port)
    yield c
    c.close()


limit_st = st.one_of(
    st.tuples(
        st.just("bucket"),
        st.integers(1, 2000),
        st.sampled_from(RATES),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(
        st.sampled_from(["minute", "hour", "day", "month"]),
        st.integers(1, 5000),
        st.just(0.0),
        st.booleans(),
        st.booleans(),
    ),
)
op_st = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.integers(0, 1),  # subject
        st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),  # which limits
        st.integers(0, 2500),  # cost
        st.integers(0, 5),  # request id
        st.booleans(),  # has record
    ),
    st.tuples(st.just("settle"), st.integers(0, 1), st.integers(0, 5), st.integers(0, 3000)),
    st.tuples(st.just("advance"), st.integers(0, 3_000_000)),
    st.tuples(st.just("jump"), st.integers(0, 3 * 86400 * 1_000_000)),
)


def _checks(prefix: str, limits: list[tuple], which: list[int], cost: int, now: int) -> list[Check]:
    out = []
    for i in which:
        unit, lim, rate, shadow, tokens = limits[i]
        c = cost if tokens else 1
        if unit == "bucket":
            out.append(Check(f"{prefix}:b:{i}", "b", c, lim, rate, 0, shadow, tokens))
        else:
            idx, reset = window(unit, now)
            out.append(Check(f"{prefix}:w:{i}:{idx}", "w", c, lim, 0.0, reset, shadow, tokens))
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limits=st.lists(limit_st, min_size=4, max_size=4),
    ops=st.lists(op_st, min_size=1, max_size=60),
)
def test_lua_and_twin_agree(client: redis.Redis, limits: list[tuple], ops: list[tuple]) -> None:
    reserve_sha = client.script_load(load_script("reserve"))
    settle_sha = client.script_load(load_script("settle"))
    run = uuid.uuid4().hex[:8]
    state = MemoryState()
    now = int(time.time() * 1e6) + 86400 * 1_000_000  # windows reset in the wall clock's future
    for op in ops:
        if op[0] in ("advance", "jump"):
            now += op[1]
            continue
        subject = f"tw:{{t{run}-{op[1]}}}"
        if op[0] == "reserve":
            _, _, which, cost, rid, has_record = op
            record = f"{subject}:r:{rid}"
            checks = _checks(subject, limits, which, cost, now)
            trace = f"00-{run}-{rid}-01" if cost % 2 else None  # kept when tracing is on
            want = reserve(state, record if has_record else None, checks, now, TTL_MS, trace)
            keys, args = reserve_args(record, has_record, checks, now, TTL_MS, trace)
            raw = client.evalsha(reserve_sha, len(keys), *keys, *args)
            got = (
                bool(raw[0]),
                [tuple(int(x) for x in raw[i : i + 3]) for i in range(1, len(raw), 3)],
            )
            assert got == (
                want.admitted,
                [(int(o.ok), o.remaining, o.retry_us) for o in want.outcomes],
            )
        else:
            _, _, rid, actual = op
            record = f"{subject}:r:{rid}"
            want_s = settle(state, record, actual, now)
            raw = client.evalsha(settle_sha, 1, record, now, actual)
            trace = raw[2].decode() if len(raw) > 2 and raw[2] is not None else None
            assert (bool(raw[0]), int(raw[1]), trace) == (want_s.found, want_s.delta, want_s.trace)


def test_settle_is_idempotent_and_refunds(client: redis.Redis) -> None:
    sha_r = client.script_load(load_script("reserve"))
    sha_s = client.script_load(load_script("settle"))
    subject = f"tw:{{idem-{uuid.uuid4().hex[:8]}}}"
    now = int(time.time() * 1e6)
    checks = [Check(f"{subject}:b:tokens", "b", 600, 1000, 0.0, 0, False, True)]
    keys, args = reserve_args(f"{subject}:r:1", True, checks, now, 60_000)
    raw = client.evalsha(sha_r, len(keys), *keys, *args)
    assert raw[:3] == [1, 1, 400]
    assert client.evalsha(sha_s, 1, f"{subject}:r:1", now, 100) == [1, -500, None]  # no trace
    assert client.evalsha(sha_s, 1, f"{subject}:r:1", now, 100) == [0, 0]  # second: no-op
    assert float(client.hget(f"{subject}:b:tokens", "tk")) == 900.0  # 1000 - 100 real cost
