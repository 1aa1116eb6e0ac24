"""The filter server reads the pool state before it serves: its first requests are admitted
against the pool's real saturation, not the policy's capacity alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp import web

from filters.app import FilterApp, Settings
from runtime.poolstate.reader import POOLS_PATH
from runtime.poolstate.state import PoolState, PoolSummary, ReplicaState
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


async def test_the_first_requests_see_the_pool_state(tmp_path: Path) -> None:
    replica = ReplicaState(saturation=1.5, running=15)
    doc = PoolState(1, 0.0, {"chat": PoolSummary({"127.0.0.1:9001": replica}, 10)}).to_json()

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
        assert gate is not None and gate.core.max_requests == 5  # 10 x (2 - 1.5)
    finally:
        await filters.aclose()
        await runner.cleanup()
