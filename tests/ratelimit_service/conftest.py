from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from policy import Policy, load_policy_text

POLICY = """
version: 1
pools:
  chat: {{models: [big, small], endpoints: [127.0.0.1:30001]}}
ratelimit: {{address: 127.0.0.1:18081, domain: tokenweir, reservation_ttl: 60s}}
tiers:
  free:
    quotas:
      tokens: {{burst: 1000, refill_per_second: 0, per_day: 5000}}
      requests: {{burst: 50, refill_per_second: 1}}
      models:
        big: {{burst: 300, refill_per_second: 0}}
      lanes:
        batch: {{per_minute: 700}}
  open: {{}}
tenants:
  {t}: {{tier: free}}
  {t}-shadow:
    tier: free
    quotas:
      tokens: {{burst: 100, refill_per_second: 0, shadow: true}}
  {t}-open: {{tier: open}}
"""


@pytest.fixture
def tenant() -> str:
    return "t" + uuid.uuid4().hex[:8]


@pytest.fixture
def policy(tenant: str) -> Policy:
    return load_policy_text(POLICY.format(t=tenant))


@pytest.fixture
async def aredis(redis_port: int) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=redis_port)
    yield client
    await client.aclose()
