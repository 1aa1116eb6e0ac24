"""Two filter processes' learned output lengths meet in a real Redis (filters/output_lengths_shared)."""

from __future__ import annotations

import redis.asyncio as aioredis

from filters.output_lengths import OutputLengths, bucket_of, upper_edge
from filters.output_lengths_shared import SharedLengths, redis_key
from tests.filters.conftest import FakeClock


async def test_each_process_reserves_from_every_process_answers(redis_port: int) -> None:
    r = aioredis.Redis.from_url(f"redis://127.0.0.1:{redis_port}/0")
    await r.flushdb()
    wall = FakeClock(6000.0)
    a, b = OutputLengths(clock=wall, window=60.0), OutputLengths(clock=wall, window=60.0)
    sa = SharedLengths(r, a, clock=wall, refresh=3600)  # rounds run by hand below
    sb = SharedLengths(r, b, clock=wall, refresh=3600)
    a.share(sa)
    b.share(sb)
    try:
        for n in range(30):  # only process a sees the answers (Envoy's log stream goes there)
            a.observe("acme", "m", 10 + n)
        assert b.quantile("acme", "m", 0.9, 20) == (0, "none")  # b alone knows nothing yet
        await sa.sync()  # a writes
        await sb.sync()  # b reads what its reservations asked for
        want = upper_edge(bucket_of(36))  # the 27th of 30
        assert b.quantile("acme", "m", 0.9, 20) == (want, "tenant")
        # the model's pooled lengths were read too (b's first question fell through to them)
        assert b.quantile("newcomer", "m", 0.9, 20) == (want, "pooled")
        ttl = await r.ttl(redis_key(("acme", "m"), 100))
        assert 0 < ttl <= 180
        # a's own answers counted once after it reads them back
        await sa.sync()
        a.quantile("acme", "m", 0.9, 20)
        await sa.sync()
        assert a.quantile("acme", "m", 0.9, 20) == (want, "tenant")
        assert a._table[("acme", "m")].count == 30
        # the next window still counts these; two windows on they are gone everywhere
        wall.now += 60.0
        await sb.sync()
        assert b.quantile("acme", "m", 0.9, 20) == (want, "tenant")
        wall.now += 120.0
        await sb.sync()
        await sb.sync()
        assert b.quantile("acme", "m", 0.9, 20) == (0, "none")
    finally:
        await r.aclose()


async def test_redis_down_keeps_the_process_learning_alone(tmp_path: object) -> None:
    from tests.helpers import free_port

    r = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.2)
    wall = FakeClock(6000.0)
    lengths = OutputLengths(clock=wall, window=60.0)
    errors: list[int] = []
    shared = SharedLengths(r, lengths, clock=wall, on_error=lambda: errors.append(1))
    lengths.share(shared)
    try:
        for _ in range(25):
            lengths.observe("acme", "m", 7)
        lengths.quantile("acme", "m", 0.9, 20)
        await shared.sync()
        assert errors == [1]
        assert lengths.quantile("acme", "m", 0.9, 20) == (7, "tenant")
    finally:
        await r.aclose()
