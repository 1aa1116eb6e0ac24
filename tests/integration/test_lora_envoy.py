"""A LoRA pool through the gateway: real Envoy, the filter server's ``lora`` plugin, two
emulators (real processes) that serve three adapters with two GPU slots each.

- requests for an adapter go to the replica that holds it (one replica loads it, the other never
  does), with SGLang's ``lora_path`` added to the body; ``base:adapter`` is the same adapter;
- an adapter the pool does not serve is a 404 JSON error in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _policy(gw: int, fp: int, replicas: list[int]) -> str:
    eps = ", ".join(f"127.0.0.1:{p}" for p in replicas)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 5s}}
pools:
  chat:
    models: [m1]
    endpoints: [{eps}]
    health_check: {{interval: 200ms, timeout: 200ms, unhealthy_threshold: 1}}
    lora: {{adapters: [sql, support, legal], slots: 2}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: openai
        match: {{prefix: /}}
        pool: chat
        filters: {{plugins: [{{name: identity, settings: {{require: false}}}}, tokens, lora, usage]}}
"""


def _emulator(tmp: Path, name: str, port: int) -> ChildProcess:
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m1",
            "--profile", "seed-2k", "--time-scale", "0.02", "--log-level", "WARNING",
            "--enable-lora", "--lora-paths", "sql=/w/sql", "support=/w/support",
            "legal=/w/legal", "--max-loras-per-batch", "2"]  # fmt: skip
    return ChildProcess(argv, log=tmp / f"{name}.log")


async def test_adapter_goes_to_its_holder_and_an_unknown_one_is_a_404(tmp_path: Path) -> None:
    gw, fp = free_port(), free_port()
    replicas = [free_port(), free_port()]
    children = [_emulator(tmp_path, f"r{i}", p) for i, p in enumerate(replicas)]
    app: FilterApp | None = None
    try:
        for port in replicas:
            await asyncio.to_thread(wait_for_port, port, 30.0)
        async with mesh(tmp_path, _policy(gw, fp, replicas), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            async with aiohttp.ClientSession() as http:

                async def chat(model: str) -> tuple[int, dict[str, Any]]:
                    body = {"model": model, "max_tokens": 3,
                            "messages": [{"role": "user", "content": "hello " * 8}]}  # fmt: skip
                    async with http.post(
                        f"http://127.0.0.1:{gw}/v1/chat/completions", json=body
                    ) as r:
                        return r.status, await r.json(content_type=None)

                async def info(port: int) -> dict[str, Any]:
                    async with http.get(f"http://127.0.0.1:{port}/get_server_info") as r:
                        return await r.json()  # type: ignore[no-any-return]

                status, answer = await chat("m1")  # Envoy's health checks find the replicas
                deadline = time.monotonic() + 20
                while status != 200 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    status, answer = await chat("m1")
                assert status == 200, answer

                for _ in range(6):
                    status, answer = await chat("sql")
                    assert status == 200, answer
                    assert answer["model"] == "sql"
                status, answer = await chat("m1:sql")  # SGLang's base:adapter form
                assert status == 200, answer
                resident = {p: (await info(p))["resident_lora_adapters"] for p in replicas}
                holders = [p for p, names in resident.items() if "sql" in names]
                assert len(holders) == 1, resident  # every sql request went to one replica

                status, answer = await chat("nope")
                assert status == 404, answer
                assert answer["error"]["code"] == "model_not_found"
                assert "nope" in answer["error"]["message"]
                status, answer = await chat("m1:nope")
                assert status == 404 and answer["error"]["code"] == "model_not_found"
    finally:
        if app is not None:
            await app.aclose()
        for child in children:
            child.close()
