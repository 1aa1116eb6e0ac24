"""The service runs unchanged on a real Redis Cluster (3 masters started here): every call of a
tenant stays on one hash slot, batches spread over the nodes, scripts load on NOSCRIPT."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from redis.asyncio.cluster import RedisCluster

from policy import load_policy_text
from quota.keys import config_key
from quota.reader import QuotaReader
from ratelimit_service.directory import seed_defaults
from tests.helpers import free_port
from tests.ratelimit_service import rls
from tests.ratelimit_service.support import redis_cluster, start_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TENANTS = [f"tenant-{i}" for i in range(12)]
POLICY = (
    "version: 1\nratelimit: {address: 127.0.0.1:1, timeout: 500ms}\n"
    "tiers: {t: {quotas: {tokens: {burst: 1000, refill_per_second: 0, per_month: 1500}}}}\n"
    "tenants:\n" + "".join(f"  {t}: {{tier: t}}\n" for t in TENANTS)
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[int]]:
    with redis_cluster(3) as ports:
        yield ports


async def test_service_on_a_cluster(cluster: list[int], tmp_path: Path) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY)
    port = free_port()
    client = RedisCluster(host="127.0.0.1", port=cluster[0])
    try:
        await client.initialize()
        slots = {client.keyslot(config_key(t)) for t in TENANTS}
        nodes = {client.get_node_from_key(config_key(t)).port for t in TENANTS}
        assert len(slots) == len(TENANTS) and len(nodes) == 3  # tenants spread over all masters
        # a live edit made before the service starts survives its seeding
        await client.hset(config_key("tenant-0"), "tokens.burst", "300")
        child = start_service(policy_path, f"redis://127.0.0.1:{cluster[0]}/0", port, tmp_path)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = rls_pb2_grpc.RateLimitServiceStub(ch)

                async def ask(t: str, n: int, rid: str, phase: str = "reserve") -> int:
                    req = rls.llm(t, n, rid=rid, phase=phase, model="m")
                    return (await stub.ShouldRateLimit(req, timeout=5)).overall_code

                # concurrent calls of all tenants: batched per node, each tenant on its slot
                codes = await asyncio.gather(
                    *(ask(t, 400, f"{t}-{i}") for t in TENANTS for i in range(3))
                )
                ok = rls_pb2.RateLimitResponse.OK
                per_tenant = {t: codes[i * 3 : i * 3 + 3].count(ok) for i, t in enumerate(TENANTS)}
                assert per_tenant["tenant-0"] == 0  # live burst 300 < 400
                assert all(per_tenant[t] == 2 for t in TENANTS[1:])  # 2 x 400 <= 1000 < 3 x 400
                reader = QuotaReader(client, load_policy_text(POLICY), timeout=5.0)
                assert await reader.remaining("tenant-1") == 200
                # settle refunds on the cluster too (the two admitted ones), and is idempotent
                for t in TENANTS[1:]:
                    for i in range(3):
                        await ask(t, 0, f"{t}-{i}", phase="settle")
                    await ask(t, 0, f"{t}-0", phase="settle")
                assert await reader.remaining("tenant-1") == 1000
                assert await reader.remaining("tenant-0") == 300
                # scripts flushed on every node: the next call reloads them (NOSCRIPT)
                await client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)
                assert await ask("tenant-2", 100, "again") == ok
        finally:
            child.close()
        assert await client.hget(config_key("tenant-0"), "tokens.burst") == b"300"
        assert await seed_defaults(client, load_policy_text(POLICY)) == 0
    finally:
        await client.aclose()
