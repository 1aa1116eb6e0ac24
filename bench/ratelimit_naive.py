"""The naive rate-limit service the issue measured (~2.5k decisions/s): the same Lua script and
limits, but one EVALSHA round trip per call through redis-py, no batching, the default asyncio
loop. Run side by side with ``python -m ratelimit_service`` by bench/ratelimit_bench.py."""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc
import redis.asyncio as aioredis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from policy import load_policy
from quota.config import effective_quotas, limits_for_tenant, tenant_defaults
from quota.keys import record_key
from ratelimit_service.plan import checks_for
from ratelimit_service.store import load_script, reserve_args


class Floor(rls_pb2_grpc.RateLimitServiceServicer):
    """No decision at all: what grpc.aio alone costs per call on this machine."""

    async def ShouldRateLimit(self, request, context):  # type: ignore[no-untyped-def]
        return rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


class Naive(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, policy_path: str, redis_url: str) -> None:
        self.policy = load_policy(policy_path)
        self.redis = aioredis.Redis.from_url(redis_url)
        self.script = self.redis.register_script(load_script("reserve"))

    async def ShouldRateLimit(self, request, context):  # type: ignore[no-untyped-def]
        d = request.descriptors[0]
        e = {x.key: x.value for x in d.entries}
        tenant = e["tenant"]
        sq = effective_quotas(tenant_defaults(self.policy, tenant), {})
        now = int(time.time() * 1e6)
        checks = checks_for(
            tenant, limits_for_tenant(sq, e.get("model"), e.get("lane")), d.hits_addend.value, now
        )
        keys, args = reserve_args(record_key(tenant, e["request_id"]), True, checks, now, 600_000)
        raw = await self.script(keys=keys, args=args)
        code = rls_pb2.RateLimitResponse.OK if raw[0] else rls_pb2.RateLimitResponse.OVER_LIMIT
        return rls_pb2.RateLimitResponse(overall_code=code)


async def serve(policy: str, redis_url: str, listen: str, floor: bool) -> None:
    server = grpc.aio.server()
    servicer = Floor() if floor else Naive(policy, redis_url)
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(servicer, server)
    server.add_insecure_port(listen)
    await server.start()
    print("naive rls listening", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--policy", required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--floor", action="store_true", help="answer OK without deciding")
    a = p.parse_args()
    asyncio.run(serve(a.policy, a.redis_url, a.listen, a.floor))
