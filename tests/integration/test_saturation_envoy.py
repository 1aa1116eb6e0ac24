"""Saturation reaches Envoy through EDS (real Envoy, real control plane): a replica whose
/metrics reports a full queue stops getting new sessions, the other replicas keep most of
theirs, and the original mapping comes back when it recovers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.mesh_harness import Backend, close_backends, mesh, start_backends

pytestmark = pytest.mark.integration

SESSIONS = 300


def sglang_metrics(running: int, queued: int) -> str:
    return (
        f'sglang:num_running_reqs{{model_name="m"}} {running}\n'
        f'sglang:num_queue_reqs{{model_name="m"}} {queued}\n'
        'sglang:token_usage{model_name="m"} 0.1\n'
    )


IDLE, FULL = sglang_metrics(1, 0), sglang_metrics(4, 4)


async def _homes(m, gw: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out = {}
    for i in range(SESSIONS):
        status, headers, _ = await m.get(gw, "/x", {"x-session-id": f"s{i}"})
        assert status == 200
        out[f"s{i}"] = headers["x-backend"]
    return out


async def _until(probe, ok, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if ok(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("weight", [0, 1])
async def test_a_full_queue_spills_new_sessions_past_the_replica_until_it_recovers(
    tmp_path: Path, weight: int
) -> None:
    bs: list[Backend] = await start_backends(3)
    for b in bs:
        b.metrics = IDLE
    gw = free_port()
    eps = ", ".join(f"127.0.0.1:{b.port}" for b in bs)
    text = f"""
version: 1
control_plane: {{pool_state: {{interval: 50ms, stale_after: 2s}}}}
pools:
  chat:
    models: [m]
    endpoints: [{eps}]
    health_check: {{enabled: false}}
    capacity: {{max_running_requests: 4, max_queued_requests: 4}}
    saturation: {{degrade_at: 1.0, recover_at: 0.8, degraded_weight: {weight}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            before = await _homes(m, gw)
            assert set(before.values()) == {"b0", "b1", "b2"}
            bs[1].metrics = FULL
            during = await _until(
                lambda: _homes(m, gw),
                lambda h: sum(v == "b1" for v in h.values()) <= 0.03 * SESSIONS,
            )
            on_b1 = sum(v == "b1" for v in during.values())
            others = [s for s, home in before.items() if home != "b1"]
            moved = sum(during[s] != before[s] for s in others) / len(others)
            print(f"weight {weight}: b1 keeps {on_b1}/{SESSIONS}, others moved {moved:.1%}")
            assert on_b1 <= 0.03 * SESSIONS, "a saturated replica still takes new sessions"
            assert all(during[s] != "b1" for s in others)
            assert moved <= 0.25
            bs[1].metrics = IDLE
            after = await _until(lambda: _homes(m, gw), lambda h: h == before)
            assert after == before, "the ring did not come back to its original mapping"
    finally:
        await close_backends(bs)
