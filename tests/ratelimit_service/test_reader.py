"""QuotaReader: read-only peek at what a tenant can still reserve."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from policy import Policy
from quota.config import Limit, effective_quotas, limits_for_tenant, tenant_defaults
from quota.errors import QuotaUnavailable
from quota.keys import config_key
from quota.reader import QuotaReader, limit_remaining
from ratelimit_service.plan import checks_for
from ratelimit_service.store import RedisStore

# the reader's default 50 ms limit per Redis round trip is what production wants; the tests that
# assert values, not time, give it slack: on a loaded 2-core box the first call (a connection and
# a script load) took longer and failed one or two of them in each of two full runs
SLACK = 5.0


async def _reserve(store: RedisStore, policy: Policy, tenant: str, tokens: int, **kw: str) -> bool:
    sq = effective_quotas(tenant_defaults(policy, tenant), {})
    now = int(time.time() * 1e6)
    checks = checks_for(tenant, limits_for_tenant(sq, kw.get("model"), kw.get("lane")), tokens, now)
    res = await store.reserve(f"rec-{tenant}", False, checks, now, 60_000)
    return res.admitted


async def _snapshot(client: aioredis.Redis, tenant: str) -> dict[bytes, bytes]:
    keys = sorted(await client.keys(f"tw:{{{tenant}}}*"))
    return {k: await client.dump(k) for k in keys}


async def test_remaining_is_the_tightest_quota(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    reader = QuotaReader(aredis, policy, timeout=SLACK)
    store = RedisStore(aredis)
    try:
        assert await reader.remaining(tenant) == 1000
        assert await reader.remaining(tenant, model="big") == 300
        assert await _reserve(store, policy, tenant, 250, lane="batch")
        assert await reader.remaining(tenant) == 750
        assert await reader.remaining(tenant, model="big") == 300  # model bucket not charged
        assert await reader.remaining(tenant, lane="batch") == 450  # 700/minute minus 250
        assert await _reserve(store, policy, tenant, 100, model="big")
        assert await reader.remaining(tenant, model="big") == 200
    finally:
        await store.aclose()


async def test_live_edit_wins_and_peek_writes_nothing(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    reader = QuotaReader(aredis, policy, timeout=SLACK)
    await aredis.hset(config_key(tenant), mapping={"tokens.burst": "40", "tokens.per_day": "none"})
    assert await reader.remaining(tenant) == 40
    before = await _snapshot(aredis, tenant)
    for _ in range(3):
        await reader.remaining(tenant, model="big", lane="batch")
    assert await _snapshot(aredis, tenant) == before


async def test_no_token_quota_gives_none(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    reader = QuotaReader(aredis, policy, timeout=SLACK)
    assert await reader.remaining(f"{tenant}-open") is None
    assert await reader.remaining("nobody-knows-me") is None
    # the tenant's own tokens quota replaces the tier's (per quota), and it is shadow only
    assert await reader.remaining(f"{tenant}-shadow") is None


async def test_clock_is_injected(aredis: aioredis.Redis, policy: Policy, tenant: str) -> None:
    store = RedisStore(aredis)
    try:
        assert await _reserve(store, policy, tenant, 4000, lane="interactive") is False  # > burst
        await aredis.hset(config_key(tenant), "tokens.refill_per_second", "10")
        assert await _reserve(store, policy, tenant, 900)
        now = time.time()
        assert await QuotaReader(aredis, policy, clock=lambda: now, timeout=SLACK).remaining(
            tenant
        ) in (100, 101)
        later = QuotaReader(aredis, policy, clock=lambda: now + 30, timeout=SLACK)
        assert await later.remaining(tenant) in (400, 401)
    finally:
        await store.aclose()


async def test_a_hanging_redis_times_out(policy: Policy, tenant: str) -> None:
    class Hanging:
        def pipeline(self, transaction: bool) -> Hanging:
            return self

        def execute_command(self, *args: object) -> None:
            pass

        async def execute(self, raise_on_error: bool) -> list[object]:
            await asyncio.sleep(10)
            return []

    reader = QuotaReader(Hanging(), policy, timeout=0.05)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        await reader.remaining(tenant)
    assert time.perf_counter() - t0 < 1
    await reader.aclose()


async def test_concurrent_peeks_share_round_trips(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    reader = QuotaReader(aredis, policy, timeout=SLACK)  # round trips are asserted, not time
    values = await asyncio.gather(*(reader.remaining(tenant) for _ in range(50)))
    assert values == [1000] * 50
    assert reader.batches < 50


async def test_scripts_flushed_from_redis_are_loaded_again(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    reader = QuotaReader(aredis, policy, timeout=SLACK)
    await aredis.script_flush()
    assert await reader.remaining(tenant) == 1000


async def test_a_redis_error_is_quota_unavailable(policy: Policy, tenant: str) -> None:
    class Broken:
        def pipeline(self, transaction: bool) -> Broken:
            return self

        def execute_command(self, *args: object) -> None:
            pass

        async def execute(self, raise_on_error: bool) -> list[object]:
            raise ConnectionError("connection refused")

    with pytest.raises(QuotaUnavailable, match="connection refused"):
        await QuotaReader(Broken(), policy).remaining(tenant)


async def test_usage_is_the_quota_windows_own_accounting(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    """The dashboard's windowed numbers: a bucket's capacity minus its level, a window's counter
    (reservations included), live edits applied; one entry per limit of the tokens quota."""
    store = RedisStore(aredis)
    try:
        now = time.time()
        reader = QuotaReader(aredis, policy, clock=lambda: now, timeout=SLACK)
        fresh = await reader.usage(tenant)
        assert [(u.window, u.limit, u.used, u.remaining) for u in fresh] == [
            ("bucket", 1000, 0, 1000),
            ("per_day", 5000, 0, 5000),
        ]
        assert await _reserve(store, policy, tenant, 250, model="big")
        await aredis.hset(config_key(tenant), "tokens.refill_per_second", "10")
        later = QuotaReader(aredis, policy, clock=lambda: time.time() + 5, timeout=SLACK)
        bucket, day = await later.usage(tenant)
        assert 190 <= bucket.used <= 200 and bucket.remaining == 1000 - bucket.used  # refilled 50
        assert bucket.rate == 10.0 and bucket.reset_s is not None and 19 <= bucket.reset_s <= 20
        assert (day.used, day.remaining) == (250, 4750)  # a window does not refill
        assert day.reset_s is not None and 0 < day.reset_s <= 86400 + 5
        assert await reader.usage(f"{tenant}-open") == []
    finally:
        await store.aclose()


async def test_usage_of_request_quotas_and_shadow_limits_for_the_binding_limit(
    aredis: aioredis.Redis, policy: Policy, tenant: str
) -> None:
    """The dashboard's binding limit reads every quota: the requests bucket is drawn down by
    each reservation (a request), the tokens bucket by its tokens; shadow limits say so."""
    store = RedisStore(aredis)
    try:
        assert await _reserve(store, policy, tenant, 100)
        assert await _reserve(store, policy, tenant, 100)
        now = time.time()
        got = await QuotaReader(aredis, policy, clock=lambda: now, timeout=SLACK).usage(
            tenant, ("tokens", "requests")
        )
        by = {(u.quota, u.window): u for u in got}
        assert set(by) == {("tokens", "bucket"), ("tokens", "per_day"), ("requests", "bucket")}
        assert by[("tokens", "bucket")].used == 200 and not by[("tokens", "bucket")].shadow
        assert 1 <= by[("requests", "bucket")].used <= 2  # 2 of 50, refilling 1 a second
        shadow = await QuotaReader(aredis, policy, timeout=SLACK).usage(f"{tenant}-shadow")
        assert [(u.window, u.shadow) for u in shadow] == [("bucket", True)]
    finally:
        await store.aclose()


def test_a_bucket_state_that_is_not_tk_ts_is_quota_unavailable() -> None:
    bucket = Limit("tokens", "bucket", 100, 1.0, shadow=False, tokens=True)
    assert limit_remaining(bucket, [None, None], 0) == 100
    assert limit_remaining(bucket, [b"40", b"0"], 0) == 40
    for bad in (b"40", [b"40"], []):
        with pytest.raises(QuotaUnavailable, match="not \\[tk, ts\\]"):
            limit_remaining(bucket, bad, 0)
