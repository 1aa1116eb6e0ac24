"""LoRA on the emulator over HTTP: SGLang's endpoints and shapes, the slot limit, the load cost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from backends.emulator.lora_config import LoraConfig

pytestmark = pytest.mark.integration


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    lora = LoraConfig(
        enabled=True, paths=(("a", "/w/a"), ("b", "/w/b")), max_loras_per_batch=1,
        max_loaded_loras=3, load_s=4.0, register_s=0.0,
    )  # fmt: skip
    server = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.05, seed=7, lora=lora)
    )
    yield server
    await server.aclose()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _metrics(http: aiohttp.ClientSession, emu: EmulatorServer) -> dict[str, float]:
    async with http.get(emu.url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"[{s.labels['lora_name']}]" if "lora_name" in s.labels else "")
            out[key] = s.value
    return out


async def test_load_unload_and_unknown_adapter_answer_sglangs_shapes(
    emu: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        emu.url + "/load_lora_adapter", json={"lora_name": "c", "lora_path": "/w/c"}
    ) as r:
        assert r.status == 200
        assert await r.json() == {
            "success": True,
            "error_message": None,
            "loaded_adapters": {"a": "/w/a", "b": "/w/b", "c": "/w/c"},
        }
    async with http.post(
        emu.url + "/load_lora_adapter", json={"lora_name": "c", "lora_path": "/w/c"}
    ) as r:
        body = await r.json()
        assert r.status == 400 and not body["success"]
        assert body["error_message"].startswith("LoRA with name c already exists")
    async with http.post(emu.url + "/unload_lora_adapter", json={"lora_name": "c"}) as r:
        assert r.status == 200 and "c" not in (await r.json())["loaded_adapters"]
    # an adapter that is not loaded: SGLang's message, 400
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(emu.url + "/v1/chat/completions", json={**chat, "model": "base:c"}) as r:
        assert r.status == 400
        err = await r.json()
        assert "requested LoRA adapters are not loaded: c" in str(err)
    async with http.post(emu.url + "/v1/chat/completions", json={**chat, "model": "base:a"}) as r:
        assert r.status == 200
    async with http.post(
        emu.url + "/generate",
        json={"text": "hello there", "lora_path": "b", "sampling_params": {"max_new_tokens": 2}},
    ) as r:
        assert r.status == 200
    async with http.get(emu.url + "/v1/models") as r:
        ids = {(m["id"], m.get("parent")) for m in (await r.json())["data"]}
        assert {("a", "emulated-model"), ("b", "emulated-model")} <= ids
    async with http.get(emu.url + "/get_server_info") as r:
        info = await r.json()
        assert info["max_loras_per_batch"] == 1 and info["resident_lora_adapters"] == ["b"]
    m = await _metrics(http, emu)
    assert m["sglang:lora_slot_loads_total"] == 2 and m["sglang:lora_resident[b]"] == 1


async def test_one_slot_serialises_two_adapters_and_each_swap_costs_a_load(
    emu: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    async def gen(lora: str) -> float:
        body = {"text": "x " * 20, "lora_path": lora, "sampling_params": {"max_new_tokens": 4}}
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with http.post(emu.url + "/generate", json=body) as r:
            assert r.status == 200
        return loop.time() - t0

    # same adapter twice: one load; the second request shares the batch
    await asyncio.gather(gen("a"), gen("a"))
    assert emu.lora_slots.loads_total == 1
    # a and b with one slot: never in one batch, b waits for a, and swapping costs a load each
    times = await asyncio.gather(gen("b"), gen("a"))
    assert emu.lora_slots.loads_total == 3
    load = 4.0 * 0.05  # load_s at this time scale: 200 ms, well above the box's jitter
    # one slot: the later one started after the first finished, and paid its own load (in one
    # batch, both would finish in the same step)
    assert max(times) - min(times) > load / 2
