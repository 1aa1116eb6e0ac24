"""``--flavor vllm``: the emulator's vLLM metric names, routes and KV-event fields."""

from __future__ import annotations

import aiohttp
import msgspec

from backends.emulator.__main__ import parse_args
from backends.emulator.app import start_emulator
from backends.emulator.flavor import VllmEventEncoder
from backends.emulator.radix_cache import RadixCache
from backends.emulator.settings import EmulatorSettings
from batch_service.stepguard import StepGuard
from batch_service.stepmeter import StepMeter, parse_step_reading
from poolstate import parse_backend_metrics
from poolstate.counters import parse_counters
from prefixindex.hashing import prefix_block_ids
from prefixindex.vllm_wire import VllmBlockMap
from prefixindex.wire import StoredBlocks


def test_vllm_flags_set_the_same_settings() -> None:
    s = parse_args(["--flavor", "vllm", "--max-num-seqs", "7", "--block-size", "16"])
    assert (s.flavor, s.max_running_requests, s.page_size) == ("vllm", 7, 16)


def test_events_carry_vllm_fields_and_hashes_the_gateway_recomputes() -> None:
    cache = RadixCache(1000, page_size=4, record_events=True)
    encoder = VllmEventEncoder(seed=b"s" * 32)
    assert encoder(0.0, cache.take_events()) is None  # vLLM announces no empty cache at start
    tokens = list(range(40, 58))  # four whole pages and two tokens
    cache.insert(tokens)
    first = encoder(1.0, cache.take_events())
    cache.insert([*tokens[:16], 7, 8, 9, 10])
    second = encoder(2.0, cache.take_events())
    assert first is not None and second is not None
    batch = msgspec.msgpack.decode(first)
    assert set(batch) == {"ts", "events", "data_parallel_rank"}
    event = batch["events"][0]
    assert event["type"] == "BlockStored" and isinstance(event["block_hashes"][0], bytes)
    assert len(event["token_ids"]) == 16  # whole blocks only
    ours = prefix_block_ids([*tokens[:16], 7, 8, 9, 10], 4)
    assert int.from_bytes(event["block_hashes"][0], "big") != ours[0]
    m = VllmBlockMap(4)
    got = [e for seq, raw in enumerate((first, second)) for e in m.read(seq, raw).events]
    stored = [h for e in got if isinstance(e, StoredBlocks) for h in e.block_hashes]
    assert stored == ours  # the second insert's block chains onto the first's


async def test_a_vllm_flavoured_server_answers_as_vllm_does() -> None:
    server = await start_emulator(EmulatorSettings(flavor="vllm", time_scale=0.01, port=0))
    try:
        async with aiohttp.ClientSession() as http:
            for path, status in (("/v1/models", 200), ("/health", 200), ("/get_server_info", 404)):
                async with http.get(server.url + path) as r:
                    assert r.status == status, path
            async with http.get(server.url + "/v1/models") as r:
                assert (await r.json())["data"][0]["owned_by"] == "vllm"
            body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
            async with http.post(server.url + "/generate", json=body) as r:
                assert r.status == 404
            body2 = {"model": "emulated-model", "prompt": "hello there", "max_tokens": 5}
            async with http.post(server.url + "/v1/completions", json=body2) as r:
                assert r.status == 200
            async with http.get(server.url + "/metrics") as r:
                text = await r.text()
        assert "sglang:" not in text
        sample = parse_backend_metrics(text, "vllm")
        assert sample.complete and sample.max_total_tokens == server.profile.max_total_tokens
        assert 'vllm:prompt_tokens_total{engine="0",model_name="emulated-model"} 2.0' in text
        # the counters the online planner and the batch runner's step guard read: a vLLM
        # replica is measured as an SGLang one is (its four token gaps, its one request)
        counters = parse_counters(text)
        assert counters is not None
        assert (counters.finished, counters.generated, counters.itl_count) == (1.0, 5.0, 4.0)
        assert counters.ttft_count == counters.queue_count == 1.0
        reading = parse_step_reading(text, 1.0)
        assert reading is not None and reading.gaps == 4.0 and reading.gaps_s > 0
    finally:
        await server.aclose()


async def test_the_step_guard_measures_a_vllm_replica() -> None:
    """The batch runner's step meter reads a vLLM replica's token gaps over HTTP and the guard
    fits its step from them (before, a vLLM page gave no reading: the guard kept its unmeasured
    bound, no batch stream beside fewer than 10 interactive ones)."""
    server = await start_emulator(EmulatorSettings(flavor="vllm", time_scale=0.01, port=0))
    try:
        endpoint = server.url.removeprefix("http://")
        guard = StepGuard(0.1)
        clock = iter(float(i) for i in range(100))
        async with aiohttp.ClientSession() as http:
            meter = StepMeter(guard, lambda: [endpoint], http, clock=lambda: next(clock))
            body = {"model": "emulated-model", "prompt": "hello there", "max_tokens": 8}
            await meter.once()
            for _ in range(2):  # two intervals, each with a request's token gaps in it
                async with http.post(server.url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                await meter.once()
        fit = guard.fit(endpoint)
        assert fit is not None and fit.intervals == 2 and fit.slope > 0
    finally:
        await server.aclose()
