"""Redis clients under a burst, against a real redis-server: the filter server's commands wait
for a free connection instead of failing with "Too many connections", and the batched readers
(budget, quota directory) never need more than two connections."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from filters.redis_pool import redis_client
from policy import load_policy
from quota.reader import QuotaReader
from ratelimit_service.store import RedisStore
from tests.filters.conftest import ROOT

pytestmark = pytest.mark.integration


async def test_300_concurrent_reads_wait_for_a_bounded_pool(redis_port: int) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    client = redis_client(url, timeout=1.0, max_connections=8)
    admin = aioredis.Redis.from_url(url)
    try:
        await admin.hset("tw:test:pool", mapping={"a": "1"})
        # connections an earlier test of this worker left closing on the shared Redis are
        # not this pool's: counted before, left out after
        before = {c["id"] for c in await admin.client_list()}
        results = await asyncio.gather(*(client.hgetall("tw:test:pool") for _ in range(300)))
        assert results == [{b"a": b"1"}] * 300
        clients = [c for c in await admin.client_list() if c["id"] not in before]
        assert len(clients) <= 8, len(clients)  # the pool's connections
    finally:
        await admin.delete("tw:test:pool")
        await client.aclose()
        await admin.aclose()


async def test_budget_reads_and_quota_lookups_never_need_more_than_two_connections(
    redis_port: int,
) -> None:
    """The budget reader (filter server) and the rate-limit service's store batch concurrent
    calls into at most two pipelines: over a NON-blocking pool of two connections, which raises
    "Too many connections" the moment a third is needed, 300 concurrent calls of each succeed."""
    url = f"redis://127.0.0.1:{redis_port}/0"
    pool = aioredis.ConnectionPool.from_url(url, max_connections=2)
    client = aioredis.Redis(connection_pool=pool)
    policy = load_policy(ROOT / "examples" / "mesh.yaml")
    reader = QuotaReader(client, policy, timeout=5.0)
    store = RedisStore(client, deadline=5.0)
    try:
        left = await asyncio.gather(*(reader.remaining("demo-free") for _ in range(300)))
        assert len(set(left)) == 1 and left[0] is not None
        live = await asyncio.gather(*(store.hgetall("tw:{demo-free}:quota") for _ in range(300)))
        assert len(live) == 300
    finally:
        await store.aclose()
        await client.aclose()
        await pool.aclose()
