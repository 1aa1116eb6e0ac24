"""Chaos drills behind docs/runbooks.md (real Envoy, control plane, filter server, rate-limit
service, Redis, SGLang emulators): each injects a fault and asserts what the runbook says users
see. Drills already proven elsewhere are cited in the runbook, not repeated here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.integration.safety_stack import SafetyStack, safety_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PLUGINS = "identity, tokens, lane, usage"
_RUNNING = re.compile(r"^sglang:num_running_reqs\{[^}]*\}\s+([0-9.e+]+)$", re.M)


def chat(text: str, *, stream: bool = True, max_tokens: int = 40) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": text}],
                       "max_tokens": max_tokens, "stream": stream}).encode()  # fmt: skip


async def ok_requests(st: SafetyStack, n: int, prefix: str) -> list[int]:
    out = []
    for i in range(n):
        headers = st.headers(**{"x-session-id": f"{prefix}-{i}"})
        async with st.session.post(
            st.url + "/v1/chat/completions", data=chat("hi", stream=False, max_tokens=4),
            headers=headers,
        ) as r:  # fmt: skip
            await r.read()
            out.append(r.status)
    return out


async def running(st: SafetyStack, port: int) -> float:
    async with st.session.get(f"http://127.0.0.1:{port}/metrics") as r:
        return sum(float(v) for v in _RUNNING.findall(await r.text()))


async def test_a_replica_killed_mid_stream(tmp_path: Path, redis_port: int) -> None:
    """Runbook "A replica lost mid-stream": the streams it carried end without ``[DONE]`` and are
    charged what they produced; new requests go to the surviving replicas at once."""
    async with safety_stack(tmp_path, redis_port, replicas=2, slow=40, plugins=PLUGINS,
                            retries=True) as st:  # fmt: skip
        async with st.session.post(
            st.url + "/v1/chat/completions", data=chat("a long story"),
            headers=st.headers(**{"x-session-id": "victim"}),
        ) as r:  # fmt: skip
            assert r.status == 200
            got = await r.content.readline()
            busy = [p for p in st.replicas if await running(st, p) > 0]
            assert len(busy) == 1
            victim = busy[0]
            os.kill(st.emulators[victim].proc.pid, signal.SIGKILL)
            try:
                got += await r.read()
            except Exception as exc:
                assert "Payload" in type(exc).__name__ or "Connection" in type(exc).__name__
        assert b"[DONE]" not in got  # the client sees the stream cut, not a fake ending
        spent = await st.settled("acme", 0)
        assert 0 < spent < 2 * 40 + 20  # what was produced, not the 40-token reservation twice
        assert await ok_requests(st, 10, "after") == [200] * 10  # the survivor takes them


async def test_the_control_plane_down(tmp_path: Path, redis_port: int) -> None:
    """Runbook "The control plane is down": Envoy keeps its last configuration; requests are
    served, limited and charged as before."""
    async with safety_stack(tmp_path, redis_port, plugins=PLUGINS) as st:
        assert await ok_requests(st, 3, "before") == [200] * 3
        spent = await st.settled("acme", 0)
        await st.mesh.plane.xds.aclose()  # the xDS server is gone (process down, for Envoy)
        await asyncio.sleep(1.0)
        assert await ok_requests(st, 5, "during") == [200] * 5
        assert await st.settled("acme", spent) > spent  # still charged


async def test_a_bad_policy_push(tmp_path: Path, redis_port: int) -> None:
    """Runbook "A bad policy push": the bad file is refused with file:line, counted, and the last
    good configuration keeps serving in the control plane and the filter server."""
    async with safety_stack(tmp_path, redis_port, plugins=PLUGINS) as st:
        good = st.mesh.policy_path.read_text()
        st.mesh.write_policy(good.replace("max_tokens: 64", "max_tokens: -5"))
        registry = st.mesh.plane.registry
        for _ in range(100):
            if registry.get_sample_value("tokenweir_config_reloads_total", {"result": "error"}):
                break
            await asyncio.sleep(0.1)
        assert registry.get_sample_value("tokenweir_config_reloads_total", {"result": "error"})
        assert await ok_requests(st, 5, "bad") == [200] * 5
        assert (await st.app.reload()).ok is False  # the filter server refuses it too
        assert await ok_requests(st, 3, "still") == [200] * 3


async def test_redis_slow_with_idempotency_keys(tmp_path: Path, redis_port: int) -> None:
    """Runbook "Redis down or slow": a Redis that answers nothing for 3 s (CLIENT PAUSE) does not
    fail requests; idempotency keys are served without the guarantee (``on_store_error: run``)
    and counted."""
    plugins = "identity, idempotency, tokens, lane, usage"
    async with safety_stack(tmp_path, redis_port, plugins=plugins) as st:
        assert await ok_requests(st, 1, "warm") == [200]  # the API key is known (last answer)
        admin = aioredis.Redis.from_url(f"redis://127.0.0.1:{redis_port}/0")
        try:
            await admin.execute_command("CLIENT", "PAUSE", "3000", "ALL")
            async with st.session.post(
                st.url + "/v1/chat/completions", data=chat("during", stream=False),
                headers=st.headers(**{"idempotency-key": "slow-1"}),
            ) as r:  # fmt: skip
                assert r.status == 200
                await r.read()
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
            await admin.aclose()
        assert st.metric("tokenweir_filters_idempotency_total", route="llm",
                         outcome="store_error") >= 1  # fmt: skip
