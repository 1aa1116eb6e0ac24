"""The entry point: reloads the policy file when it changes (live Redis edits still win), serves
/metrics, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from quota.keys import config_key
from tests.helpers import free_port, free_port_block, wait_for_port
from tests.ratelimit_service import rls
from tests.ratelimit_service.support import metric_sum, start_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
POLICY = """
version: 1
ratelimit: {{address: 127.0.0.1:1, timeout: 500ms}}
tiers: {{t: {{quotas: {{tokens: {{burst: {burst}, refill_per_second: 0}}}}}}}}
tenants: {{{tenant}: {{tier: t}}, {tenant}-edited: {{tier: t}}}}
"""
OK = rls_pb2.RateLimitResponse.OK


async def test_policy_reload_metrics_and_sigterm(tmp_path: Path, redis_port: int) -> None:
    tenant = f"reload{time.time_ns()}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(burst=100, tenant=tenant))
    r = redis.Redis(port=redis_port)
    r.hset(config_key(f"{tenant}-edited"), "tokens.burst", "120")  # a live edit before start
    port, mport = free_port(), free_port()
    svc = start_service(
        policy,
        f"redis://127.0.0.1:{redis_port}/0",
        port,
        tmp_path,
        extra=["--metrics-port", str(mport)],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = rls_pb2_grpc.RateLimitServiceStub(ch)

            async def code(t: str, n: int) -> int:
                return (
                    await stub.ShouldRateLimit(rls.llm(t, n, rid=str(time.time_ns())), timeout=5)
                ).overall_code

            assert await code(tenant, 150) != OK
            policy.write_text(POLICY.format(burst=1000, tenant=tenant))
            deadline = time.monotonic() + 10
            while await code(tenant, 150) != OK:
                assert time.monotonic() < deadline, "the new policy was not picked up"
                await asyncio.sleep(0.2)
            assert await code(f"{tenant}-edited", 130) != OK  # the live edit (120) still wins
            assert r.hget(config_key(tenant), "tokens.burst") == b"1000"
            # a hostile edit (500+ levels) is refused, counted, and the next fix is picked up
            policy.write_text("version: 1\nplanner: " + "{a: " * 600 + "1" + "}" * 600 + "\n")
            async with httpx.AsyncClient() as h:
                while (
                    "tokenweir_config_last_reload_error 1.0"
                    not in (await h.get(f"http://127.0.0.1:{mport}/metrics")).text
                ):
                    assert time.monotonic() < deadline + 10, "the hostile edit was not seen"
                    await asyncio.sleep(0.2)
            assert await code(tenant, 150) == OK  # the last good policy (burst 1000) serves
            policy.write_text(POLICY.format(burst=100, tenant=tenant))
            while await code(tenant, 150) == OK:
                assert time.monotonic() < deadline + 20, "the fix after a bad edit was ignored"
                await asyncio.sleep(0.2)
        async with httpx.AsyncClient() as h:
            text = (await h.get(f"http://127.0.0.1:{mport}/metrics")).text
        assert (
            'tokenweir_ratelimit_decisions_total{quota="tokens.bucket",result="over_limit"}' in text
        )
    finally:
        svc.close()
        r.close()
    assert svc.proc.returncode == 0
    assert "Traceback" not in svc.log.read_text()


async def test_processes_share_the_port(tmp_path: Path, redis_port: int) -> None:
    tenant = f"procs{time.time_ns()}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(burst=10**6, tenant=tenant))
    port, mport = free_port(), free_port_block(2)
    svc = start_service(
        policy,
        f"redis://127.0.0.1:{redis_port}/0",
        port,
        tmp_path,
        extra=["--metrics-port", str(mport), "--processes", "2"],
    )
    try:
        for m in (mport, mport + 1):  # both workers up (the second binds the same port)
            await asyncio.to_thread(wait_for_port, m, 30.0)
        opts = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts) for _ in range(12)]
        stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
        codes = await asyncio.gather(
            *(
                s.ShouldRateLimit(rls.llm(tenant, 1, rid=f"{i}-{j}"), timeout=5)
                for i, s in enumerate(stubs)
                for j in range(5)
            )
        )
        assert all(c.overall_code == OK for c in codes)
        for c in channels:
            await c.close()
        served = []
        async with httpx.AsyncClient() as h:
            for m in (mport, mport + 1):
                text = (await h.get(f"http://127.0.0.1:{m}/metrics")).text
                served.append(metric_sum(text, "tokenweir_ratelimit_decisions_total"))
        assert sum(served) == 60 and all(n > 0 for n in served), served
    finally:
        svc.close()
    assert svc.proc.returncode == 0
