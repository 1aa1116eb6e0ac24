"""Canary end to end (real Envoy, control plane, filter server, rate-limit service, Redis,
SGLang emulators): the weight is honoured within tolerance, a session stays on its version, the
force header works only for allowed tenants, and an injected fault on the canary (500s, or a
slow canary) rolls the weight back to 0 automatically: Envoy then sends everyone to the baseline,
the rollback is counted on /metrics and reported by ``GET /api/v1/canary``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from controlplane.canary import CANARY_PATH
from tests.integration.safety_stack import SafetyStack, safety_stack
from tokenweir.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PLUGINS = "identity, canary, tokens, lane, usage"
BODY = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 4}).encode()  # fmt: skip


async def version(st: SafetyStack, session: str, tenant: str = "acme", **h: str) -> str:
    headers = st.headers(tenant, **{"x-session-id": session, **h})
    async with st.session.post(st.url + "/v1/chat/completions", data=BODY, headers=headers) as r:
        await r.read()
        return r.headers.get("x-tokenweir-version", "?") + ("" if r.status == 200 else "!")


async def canary_status(st: SafetyStack) -> dict:
    port = st.mesh.plane.settings.metrics.port
    async with st.session.get(f"http://127.0.0.1:{port}{CANARY_PATH}") as r:
        return (await r.json())["pools"]["chat"]


async def test_weight_stickiness_and_forcing(tmp_path: Path, redis_port: int) -> None:
    canary = "weight: 30, force_tenants: [acme], rollback: {enabled: false}"
    async with safety_stack(tmp_path, redis_port, replicas=2, canary_replicas=1,
                            canary=canary, plugins=PLUGINS) as st:  # fmt: skip
        seen = Counter([await version(st, f"s-{i}") for i in range(120)])
        assert set(seen) <= {"baseline", "canary"}, seen
        assert 0.18 <= seen["canary"] / 120 <= 0.42, seen  # 30 % within tolerance
        for i in range(10):  # a session stays on its version
            first = await version(st, f"sticky-{i}")
            assert [await version(st, f"sticky-{i}") for _ in range(3)] == [first] * 3
        base = "s-0"
        for i in range(120):
            if await version(st, f"s-{i}") == "baseline":
                base = f"s-{i}"
                break
        assert await version(st, base, **{"x-canary": "canary"}) == "canary"  # acme may force
        assert await version(st, base, "globex", **{"x-canary": "canary"}) == "baseline"
        assert st.metric("tokenweir_filters_canary_forced_total", pool="chat",
                         outcome="ignored") == 1  # fmt: skip


async def drive_until_rolled_back(st: SafetyStack, timeout: float = 30.0) -> tuple[float, dict]:
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < timeout:
        await asyncio.gather(*(version(st, f"r-{i}-{j}") for j in range(4)))
        i += 1
        status = await canary_status(st)
        if status["state"] == "rolled_back":
            return time.monotonic() - start, status
    raise AssertionError(f"no rollback within {timeout}s: {await canary_status(st)}")


@pytest.mark.parametrize(("fault", "reason"), [({"error_rate": 1.0}, "error_rate"),
                                               ({"slow": 200}, "t")])  # fmt: skip
async def test_an_injected_fault_rolls_the_canary_back(
    tmp_path: Path, redis_port: int, fault: dict, reason: str
) -> None:
    canary = (
        "weight: 50, rollback: {interval: 200ms, window: 3s, min_requests: 5, "
        "max_error_rate: 0.2, max_ttft_ratio: 3, max_tbt_ratio: 3, latency_floor: 20ms}"
    )
    async with safety_stack(tmp_path, redis_port, replicas=1, canary_replicas=1,
                            canary=canary, plugins=PLUGINS) as st:  # fmt: skip
        healthy = Counter([await version(st, f"h-{i}") for i in range(16)])
        assert seen_both(healthy) and (await canary_status(st))["state"] == "active"
        async with st.session.post(
            f"http://127.0.0.1:{st.replicas[-1]}/_emulator/faults", json=fault
        ) as r:
            assert r.status == 200
        elapsed, status = await drive_until_rolled_back(st)
        assert status["weight"] == 0 and status["reason"].startswith(reason), status
        registry = st.mesh.plane.registry
        assert (registry.get_sample_value("tokenweir_canary_weight", {"pool": "chat"})) == 0
        await asyncio.sleep(1.0)  # Envoy applies the pushed route
        after = Counter([await version(st, f"a-{i}") for i in range(20)])
        assert after == Counter({"baseline": 20}), after
        print(f"rollback after {elapsed:.2f}s ({fault})")
        port = st.mesh.plane.settings.metrics.port
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = await asyncio.to_thread(main, ["status", "--control-plane", f"127.0.0.1:{port}"])
        assert rc == 0 and "rolled_back" in out.getvalue() and reason in out.getvalue()


def seen_both(c: Counter) -> bool:
    return c["baseline"] > 0 and c["canary"] > 0
