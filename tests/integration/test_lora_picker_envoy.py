"""The prefix picker on a LoRA pool through real Envoy: two emulators publishing KV events (an
adapter's blocks chained from its seed, with its ``lora_id``), the filter server's ``lora`` and
``picker`` plugins. A document cached under adapter ``sql`` is found for ``sql`` (a cache pick,
the replica reports the cached tokens), and neither for the base model nor for adapter
``legal`` (no cache pick, nothing cached)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_picker_envoy import OFFSET, _emulator, _free_port_block, _until

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
    lora: {{adapters: [sql, legal], slots: 2}}
    routing:
      mode: prefix_index
      min_prefix_tokens: 64
      checkpoint_bytes: 256
      index_ttl: 5s
      pending_ttl: 0s
      kv_events_port_offset: {OFFSET}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: openai
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [{{name: identity, settings: {{require: false}}}}, tokens, lora, picker, usage]}}
"""


async def test_an_adapters_cached_prefix_is_found_for_that_adapter_only(tmp_path: Path) -> None:
    gw, fp = free_port(), free_port()
    replicas = (await _free_port_block())[:2]
    lora = ("--enable-lora", "--lora-paths", "sql=/w/sql", "legal=/w/legal")
    children: list[ChildProcess] = [
        _emulator(tmp_path, i, p, extra=lora) for i, p in enumerate(replicas)
    ]
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with mesh(tmp_path, _policy(gw, fp, replicas), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None
            names = [f"127.0.0.1:{p}" for p in replicas]
            now = time.monotonic
            await _until(
                lambda: all(picker.index.known(n, now()) for n in names),
                lambda: str([picker.index.view(n, now()) for n in names]),
            )
            reg = app.metrics.registry

            def cache_picks() -> float:
                got = reg.get_sample_value(
                    "tokenweir_picker_picks_total", {"pool": "chat", "reason": "cache"}
                )
                return got or 0.0

            doc = " ".join(f"clause{i}" for i in range(600))
            async with aiohttp.ClientSession() as http:

                async def chat(model: str, text: str) -> tuple[int, dict[str, Any]]:
                    body = {"model": model, "max_tokens": 2,
                            "messages": [{"role": "user", "content": text}]}  # fmt: skip
                    async with http.post(
                        f"http://127.0.0.1:{gw}/v1/chat/completions", json=body
                    ) as r:
                        return r.status, await r.json(content_type=None)

                def cached(answer: dict[str, Any]) -> int:
                    details = answer["usage"].get("prompt_tokens_details") or {}
                    return int(details.get("cached_tokens") or 0)

                deadline = time.monotonic() + 20  # Envoy's health checks find the replicas
                status, answer = await chat("sql", doc + " first question")
                while status != 200 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    status, answer = await chat("sql", doc + " first question")
                assert status == 200, answer
                sql_marks = picker.prompt(picker.render("chat", {"messages": [
                    {"role": "user", "content": doc}]}) or b"", "sql")  # fmt: skip
                await _until(
                    lambda: len(picker.map.lookup(sql_marks.marks)) >= 10,
                    lambda: f"checkpoints mapped: {len(picker.map)}",
                )
                owner: list[str] = []

                def held() -> bool:
                    points = picker.map.lookup(sql_marks.marks)
                    counts = picker._held(points, now())
                    owner[:] = [n for n, c in counts.items() if c and c >= 10]
                    return bool(owner)

                await _until(held, lambda: "no replica holds the sql document yet")
                assert len(owner) == 1

                before = cache_picks()
                status, answer = await chat("sql", doc + " second question")
                assert status == 200, answer
                assert cache_picks() == before + 1
                assert cached(answer) >= 550, answer["usage"]
                for model in ("m1", "legal"):  # the same text, cached under sql only
                    before = cache_picks()
                    status, answer = await chat(model, doc + " a question")
                    assert status == 200, answer
                    assert cache_picks() == before, model
                    assert cached(answer) == 0, (model, answer["usage"])
    finally:
        if app is not None:
            await app.aclose()
        for child in children:
            child.close()
