"""The filter server's Redis client under a burst, against a real redis-server: commands wait
for a free connection instead of failing with "Too many connections"."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from filters.redis_pool import redis_client

pytestmark = pytest.mark.integration


async def test_300_concurrent_reads_wait_for_a_bounded_pool(redis_port: int) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    client = redis_client(url, timeout=1.0, max_connections=8)
    admin = aioredis.Redis.from_url(url)
    try:
        await admin.hset("tw:test:pool", mapping={"a": "1"})
        results = await asyncio.gather(*(client.hgetall("tw:test:pool") for _ in range(300)))
        assert results == [{b"a": b"1"}] * 300
        clients = await admin.client_list()
        assert len(clients) <= 8 + 1, len(clients)  # the pool's connections + this admin one
    finally:
        await admin.delete("tw:test:pool")
        await client.aclose()
        await admin.aclose()
