"""Three service replicas share one Redis; 200 concurrent clients hammer one small bucket.
Admitted tokens never exceed capacity plus refill (no overshoot), the bucket is really used, and
every reservation is settled or expires by itself."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.helpers import free_port, redis_server
from tests.ratelimit_service import rls
from tests.ratelimit_service.support import metric_sum, start_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BURST, RATE, TTL = 4000, 1000.0, 2.0
POLICY = f"""
version: 1
ratelimit: {{address: 127.0.0.1:1, timeout: 1s, reservation_ttl: {TTL}s}}
tiers: {{t: {{quotas: {{tokens: {{burst: {BURST}, refill_per_second: {RATE}}}}}}}}}
tenants: {{hot: {{tier: t}}}}
"""
CLIENTS, SECONDS = 200, 3.0
OK = rls_pb2.RateLimitResponse.OK


async def test_three_replicas_no_overshoot(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with redis_server() as rport:
        url = f"redis://127.0.0.1:{rport}/0"
        ports = [free_port() for _ in range(3)]
        mports = [free_port() for _ in range(3)]
        replicas = [
            start_service(
                policy, url, p, tmp_path, name=f"rls{i}", extra=["--metrics-port", str(m)]
            )
            for i, (p, m) in enumerate(zip(ports, mports, strict=True))
        ]
        try:
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in ports]
            stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
            final_charge = 0  # what the tenant really consumed: actual if settled, else reserved
            settles = crashed = admitted = denied = 0
            rng = random.Random(7)
            start = time.time()

            async def client(i: int) -> None:
                nonlocal final_charge, settles, crashed, admitted, denied
                stub = stubs[i % 3]
                n = 0
                while time.time() - start < SECONDS:
                    n += 1
                    rid = f"c{i}-{n}"
                    want = rng.randint(20, 300)
                    resp = await stub.ShouldRateLimit(rls.llm("hot", want, rid=rid), timeout=5)
                    if resp.overall_code != OK:
                        denied += 1
                        await asyncio.sleep(0.01)
                        continue
                    admitted += 1
                    if rng.random() < 0.2:  # the stream crashed: no settlement ever comes
                        crashed += 1
                        final_charge += want
                        continue
                    actual = rng.randint(0, want)
                    await asyncio.sleep(rng.random() * 0.05)
                    settle = rls.llm("hot", actual, rid=rid, phase="settle")
                    await stubs[(i + 1) % 3].ShouldRateLimit(settle, timeout=5)  # another replica
                    settles += 1
                    final_charge += actual

            await asyncio.gather(*(client(i) for i in range(CLIENTS)))
            elapsed = time.time() - start
            for c in channels:
                await c.close()
            ceiling = BURST + RATE * elapsed
            assert final_charge <= ceiling, (final_charge, ceiling)
            assert final_charge >= 0.8 * BURST + 0.5 * RATE * SECONDS  # really contended
            assert denied > 0 and crashed > 0 and admitted > 100

            async with httpx.AsyncClient() as h:
                texts = [(await h.get(f"http://127.0.0.1:{m}/metrics")).text for m in mports]
            name = "tokenweir_ratelimit_settles_total"
            assert sum(metric_sum(t, name, result="settled") for t in texts) == settles
            assert (
                sum(metric_sum(t, "tokenweir_ratelimit_fallback_decisions_total") for t in texts)
                == 0
            )
            served = [metric_sum(t, "tokenweir_ratelimit_decisions_total") for t in texts]
            assert all(s > 0 for s in served)  # every replica decided

            r = redis.Redis(port=rport)
            left = len(list(r.scan_iter("tw:{hot}:r:*")))
            assert 0 < left <= crashed  # only crashed ones remain (the oldest already expired)
            time.sleep(TTL + 0.2)
            assert list(r.scan_iter("tw:{hot}:r:*")) == []  # ...and they expire by themselves
            r.close()
        finally:
            for c in replicas:
                c.close()
