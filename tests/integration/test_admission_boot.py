"""The filter server reads the pool state before it serves: its first requests are admitted
against the pool's real saturation, not the policy's capacity alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp import web

from filters.app import FilterApp, Settings
from poolstate.reader import POOLS_PATH
from poolstate.state import PoolState, PoolSummary, ReplicaState
from tests.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POLICY = """
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:{cp}}}
filters: {{address: 127.0.0.1:{fp}}}
pools:
  chat: {{models: [m1], endpoints: [127.0.0.1:9001], capacity: {{max_running_requests: 10}}}}
gateways:
  edge:
    routes:
      - {{name: llm, pool: chat, match: {{prefix: /v1/}}, filters: {{plugins: [admission]}}}}
"""


async def limit_after_start(tmp_path: Path, replicas: dict[str, ReplicaState]) -> int | None:
    """The admission limit of a filter server just started against this pool state."""
    doc = PoolState(1, 0.0, {"chat": PoolSummary(replicas, 10)}).to_json()

    async def pools(_: web.Request) -> web.Response:
        return web.json_response(doc)

    app = web.Application()
    app.router.add_get(POOLS_PATH, pools)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    cp = free_port()
    await web.TCPSite(runner, "127.0.0.1", cp).start()
    path = tmp_path / "mesh.yaml"
    path.write_text(POLICY.format(cp=cp, fp=free_port()))
    filters = FilterApp(Settings(policy_path=path), clock=time.monotonic)
    try:
        await filters.start()
        gate = filters.gates.gate("chat")  # what the first request's admission reads
        assert gate is not None
        return gate.core.max_requests
    finally:
        await filters.aclose()
        await runner.cleanup()


async def test_the_first_requests_see_the_pool_state(tmp_path: Path) -> None:
    hot = ReplicaState(saturation=1.5, running=15)
    assert await limit_after_start(tmp_path, {"127.0.0.1:9001": hot}) == 5  # 10 x (2 - 1.5)


async def test_a_queue_on_one_replica_lowers_admission(tmp_path: Path) -> None:
    """Accounted per replica: a replica with a queue offers fewer slots though the pool's mean
    saturation (0.9) is below 1 because the other idles (ring hash keeps sending the hot
    replica its keys; the mean would admit the pool's full capacity)."""
    hot = ReplicaState(saturation=1.5, running=8, queued=4)
    idle = ReplicaState(saturation=0.3, running=2)
    replicas = {"127.0.0.1:9001": hot, "127.0.0.1:9002": idle}
    assert await limit_after_start(tmp_path, replicas) == 7  # 10 x (0.5 + 1) / 2
