"""The lora plugin learns the adapters from the replicas and loads them where needed: two emulators
(real processes), ``sql`` registered on one only.

- the hub reads each replica's ``/get_server_info``: the plugin knows which replica has ``sql``
  registered and sends its requests there;
- as that holder gets busy, the gateway loads ``sql`` on the other replica ahead of demand
  (``/load_lora_adapter``), and the requests that spread there are answered (no SGLang 400).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from filters.api import Context, RouteInfo
from filters.plugins.lora.hub import LoraHub
from filters.plugins.lora.plugin import LoraPlugin
from policy.lora import LoraAdapters
from policy.model import Address, LlmPool
from policy.routing import ENDPOINT_HEADER
from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _emulator(tmp: Path, name: str, port: int, *lora: str) -> ChildProcess:
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--model", "m1",
            "--profile", "seed-2k", "--time-scale", "0.02", "--log-level", "WARNING",
            "--enable-lora", "--max-loras-per-batch", "2", *lora]  # fmt: skip
    return ChildProcess(argv, log=tmp / f"{name}.log")


async def test_adapters_are_read_from_the_replicas_and_loaded_ahead_of_demand(
    tmp_path: Path,
) -> None:
    ports = [free_port(), free_port()]
    children = [
        _emulator(tmp_path, "r0", ports[0], "--lora-paths", "sql=/w/sql"),
        _emulator(tmp_path, "r1", ports[1]),  # LoRA on, nothing registered
    ]
    names = [f"127.0.0.1:{p}" for p in ports]
    lora = LoraAdapters(adapters=("sql",), slots=2, refresh=0.0)
    pool = LlmPool(
        models=("m1", "sql"), endpoints=tuple(Address.parse(n) for n in names), lora=lora
    )
    hub = LoraHub(CollectorRegistry())
    plugin = LoraPlugin(
        {},
        SimpleNamespace(policy=SimpleNamespace(pools={"chat": pool}), lora=hub),  # type: ignore[arg-type]
    )
    try:
        for port in ports:
            await asyncio.to_thread(wait_for_port, port, 30.0)
        async with aiohttp.ClientSession() as http:

            async def info(name: str) -> dict[str, Any]:
                async with http.get(f"http://{name}/get_server_info") as r:
                    return await r.json()  # type: ignore[no-any-return]

            await hub.read("chat", lora, names)
            aff = plugin.affinity("chat")
            assert aff is not None
            assert aff.registered(names[0], "sql") is True
            assert aff.registered(names[1], "sql") is False

            placed: list[tuple[str, bytes]] = []
            for i in range(12):  # none ends: the holder gets busier with each
                ctx = Context(route=RouteInfo(name="r", pool="chat"), started=0.0)
                ctx.model = "sql"
                body = json.dumps({"text": f"q{i} hello", "sampling_params": {"max_new_tokens": 2}})
                result = await plugin.request_body(ctx, body.encode())
                assert result is not None and result.body is not None
                placed.append((result.set_headers[ENDPOINT_HEADER], result.body))
                if i == 0:
                    assert placed[0][0] == names[0]  # where it is registered
                await asyncio.sleep(0.1)  # requests arrive apart (a preload's call runs meanwhile)
            await hub.wait()
            first_on_r1 = next(i for i, (n, _) in enumerate(placed) if n == names[1])
            assert first_on_r1 >= 5  # the registered holder first, until it is busy
            loaded = (await info(names[1]))["loaded_lora_adapters"]
            assert "sql" in loaded, loaded
            loads = {
                s.labels["reason"]: s.value
                for m in hub.metrics.loads.collect()
                for s in m.samples
                if s.name.endswith("_total") and s.labels["outcome"] == "ok"
            }
            assert loads.get("ahead") == 1 and not loads.get("demand"), loads
            for name, body in placed:  # every request is answered where it was placed
                async with http.post(f"http://{name}/generate", data=body) as r:
                    assert r.status == 200, (name, await r.text())
    finally:
        await hub.aclose()
        for child in children:
            child.close()
