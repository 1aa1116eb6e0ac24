"""RedisStore on both transports (redis-py pipeline, our RESP connection): same answers, batching,
NOSCRIPT reload, deadlines, reconnects."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from ratelimit_service.errors import StoreUnavailable
from ratelimit_service.limiter import Check
from ratelimit_service.resp import pack
from ratelimit_service.store import RedisStore


@pytest.fixture(params=["redis-py", "resp"])
async def store(
    request: pytest.FixtureRequest, aredis: aioredis.Redis, redis_port: int
) -> AsyncIterator[RedisStore]:
    url = f"redis://127.0.0.1:{redis_port}/0" if request.param == "resp" else None
    s = RedisStore(aredis, deadline=2.0, fast_url=url)
    yield s
    await s.aclose()


def _checks(subject: str) -> list[Check]:
    return [Check(f"tw:{{{subject}}}:b:tokens", "b", 100, 1000, 0.0, 0, False, True)]


async def test_concurrent_calls_share_round_trips(
    store: RedisStore, aredis: aioredis.Redis
) -> None:
    t = uuid.uuid4().hex
    now = int(time.time() * 1e6)
    results = await asyncio.gather(
        *(store.reserve(f"tw:{{{t}}}:r:{i}", True, _checks(t), now, 60_000) for i in range(30))
    )
    assert [r.admitted for r in results].count(True) == 10  # 10 x 100 = the burst
    assert store.batches < 30  # batched
    settled = await store.settle(f"tw:{{{t}}}:r:0", 40, now)
    assert (settled.found, settled.delta) == (True, -60)
    await aredis.hset(f"tw:{{{t}}}:quota", mapping={"tokens.burst": "7"})
    assert await store.hgetall(f"tw:{{{t}}}:quota") == {b"tokens.burst": b"7"}


async def test_scripts_reload_after_flush(store: RedisStore, aredis: aioredis.Redis) -> None:
    t = uuid.uuid4().hex
    now = int(time.time() * 1e6)
    assert (await store.reserve(f"tw:{{{t}}}:r:1", True, _checks(t), now, 60_000)).admitted
    await aredis.script_flush()
    assert (await store.reserve(f"tw:{{{t}}}:r:2", True, _checks(t), now, 60_000)).admitted


async def test_killed_connections_fail_then_reconnect(
    store: RedisStore, aredis: aioredis.Redis
) -> None:
    t = uuid.uuid4().hex
    now = int(time.time() * 1e6)
    await store.reserve(f"tw:{{{t}}}:r:1", True, _checks(t), now, 60_000)
    await aredis.client_kill_filter(_type="normal", skipme=True)
    outcomes = []
    for i in range(3):
        try:
            outcomes.append(
                (await store.reserve(f"tw:{{{t}}}:r:{i}", True, _checks(t), now, 60_000)).admitted
            )
        except StoreUnavailable:
            outcomes.append(None)
    assert outcomes[-1] is True  # connected again by itself


async def test_deadline() -> None:
    class Hanging:
        def pipeline(self, transaction: bool) -> Hanging:
            return self

        def execute_command(self, *args: object) -> None:
            pass

        async def execute(self, raise_on_error: bool) -> list[object]:
            await asyncio.sleep(10)
            return []

    s = RedisStore(Hanging(), deadline=0.05)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        await s.reserve("tw:{x}:r:1", True, _checks("x"), 0, 1000)
    assert time.perf_counter() - t0 < 1.0
    await s.aclose()


def test_pack_is_resp() -> None:
    assert pack([("SET", "k", 1.5), ("INCRBY", b"k", 3)]) == (
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n1.5\r\n*3\r\n$6\r\nINCRBY\r\n$1\r\nk\r\n$1\r\n3\r\n"
    )


async def test_the_reservation_keeps_the_trace_for_its_settlement(
    store: RedisStore, aredis: aioredis.Redis
) -> None:
    """Tracing on: the traceparent rides in the reserve script's own call (no extra round
    trip), lives and expires with the record, and the settle script hands it back once."""
    t = uuid.uuid4().hex
    now = int(time.time() * 1e6)
    tp = f"00-{t}-00f067aa0ba902b7-01"
    calls = store.calls
    res = await store.reserve(f"tw:{{{t}}}:r:1", True, _checks(t), now, 60_000, tp)
    assert res.admitted and store.calls == calls + 1
    assert await aredis.hget(f"tw:{{{t}}}:r:1", "#t") == tp.encode()
    assert 0 < await aredis.pttl(f"tw:{{{t}}}:r:1") <= 60_000
    await store.reserve(f"tw:{{{t}}}:r:2", True, _checks(t), now, 60_000)  # tracing off
    assert await aredis.hget(f"tw:{{{t}}}:r:2", "#t") is None
    first = await store.settle(f"tw:{{{t}}}:r:1", 40, now)
    assert (first.found, first.delta, first.trace) == (True, -60, tp)
    assert (await store.settle(f"tw:{{{t}}}:r:2", 40, now)).trace is None
    assert (await store.settle(f"tw:{{{t}}}:r:1", 40, now)).found is False
