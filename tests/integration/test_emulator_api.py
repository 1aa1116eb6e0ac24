"""The emulator's HTTP API against real clients (in-process server on a loopback port)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator

pytestmark = pytest.mark.integration

NAMES_FILE = Path(__file__).resolve().parents[2] / "backends" / "metric_names.txt"


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    server = await start_emulator(EmulatorSettings(profile="seed-2k", time_scale=0.05, seed=7))
    yield server
    await server.aclose()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _client(server: EmulatorServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def _metrics(http: aiohttp.ClientSession, server: EmulatorServer) -> dict[str, float]:
    async with http.get(server.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = s.value
    return out


async def test_openai_client_chat_non_stream_and_stream(emu: EmulatorServer) -> None:
    client = _client(emu)
    messages = [{"role": "user", "content": "tell me about weirs please"}]
    resp = await client.chat.completions.create(model="m", messages=messages, max_tokens=12)  # type: ignore[arg-type]
    assert resp.choices[0].finish_reason == "length"
    assert len((resp.choices[0].message.content or "").split()) == 12
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens == len(
        ["<|user|>", "tell", "me", "about", "weirs", "please", "<|end|>", "<|assistant|>"]
    )

    stream = await client.chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == resp.choices[0].message.content  # same prompt, same seed: same answer
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    # the whole prompt except its last token was cached by the first request
    details = chunks[-1].usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == resp.usage.prompt_tokens - 1
    await client.close()


async def test_openai_client_completions_stream_and_not(emu: EmulatorServer) -> None:
    client = _client(emu)
    resp = await client.completions.create(model="m", prompt="one two three", max_tokens=5)
    assert len(resp.choices[0].text.split()) == 5
    stream = await client.completions.create(
        model="m", prompt="one two three", max_tokens=5, stream=True
    )
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == resp.choices[0].text
    models = await client.models.list()
    assert [m.id for m in models.data] == ["emulated-model"]
    await client.close()


async def test_shared_prefix_and_next_turn_are_cached(emu: EmulatorServer) -> None:
    client = _client(emu)
    system = {"role": "system", "content": " ".join(f"rule{i}" for i in range(200))}
    first = await client.chat.completions.create(
        model="m",
        messages=[system, {"role": "user", "content": "alpha question"}],  # type: ignore[list-item]
        max_tokens=8,
    )
    assert first.usage is not None and first.usage.prompt_tokens_details is None  # cold cache
    second = await client.chat.completions.create(
        model="m",
        messages=[system, {"role": "user", "content": "beta question"}],  # type: ignore[list-item]
        max_tokens=8,
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    shared = len(("<|system|> " + system["content"] + " <|end|> <|user|>").split())
    assert second.usage.prompt_tokens_details.cached_tokens == shared
    turn2 = await client.chat.completions.create(
        model="m",
        messages=[  # type: ignore[list-item]
            system,
            {"role": "user", "content": "alpha question"},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "and then?"},
        ],
        max_tokens=4,
    )
    assert turn2.usage is not None and turn2.usage.prompt_tokens_details is not None
    # turn 1's prompt and answer are cached: everything up to the answer's last word
    assert turn2.usage.prompt_tokens_details.cached_tokens >= first.usage.total_tokens
    await client.close()


async def test_generate_native_stream_is_cumulative(
    emu: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    body = {"text": "a b c d", "sampling_params": {"max_new_tokens": 6}, "stream": True}
    texts: list[str] = []
    last: dict[str, object] = {}
    async with http.post(emu.url + "/generate", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                last = json.loads(line[6:])
                texts.append(str(last["text"]))
            elif line.strip() == b"data: [DONE]":
                break
    assert len(texts[-1].split()) == 6
    for a, b in itertools.pairwise(texts):
        assert b.startswith(a)
    meta = last["meta_info"]
    assert isinstance(meta, dict)
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["e2e_latency"] > 0 and "cached_tokens" in meta
    async with http.post(emu.url + "/generate", json={**body, "stream": False}) as r:
        data = await r.json()
    assert data["text"] == texts[-1] and len(data["output_ids"]) == 6
    assert data["meta_info"]["cached_tokens"] == 3


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode()),
        (
            "/v1/chat/completions",
            json.dumps({"messages": [{"role": "bot", "content": "x"}]}).encode(),
        ),
        (
            "/v1/chat/completions",
            json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}
            ).encode(),
        ),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 40000}).encode()),
        ("/v1/completions", json.dumps({"prompt": 5}).encode()),
        ("/generate", json.dumps({"sampling_params": {}}).encode()),
        ("/generate", json.dumps({"input_ids": 5}).encode()),  # not a list: 400, never a 500
        ("/generate", json.dumps({"input_ids": {"0": [1]}}).encode()),
        # bad text: a lone surrogate escape, invalid UTF-8, no body at all (never a 500, which
        # counts toward ejecting a healthy replica)
        (
            "/v1/chat/completions",
            json.dumps({"messages": [{"role": "user", "content": "\ud800"}]}).encode(),
        ),
        ("/v1/completions", json.dumps({"prompt": "a \udfff b"}).encode()),
        ("/generate", json.dumps({"text": "\ud800"}).encode()),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff"}]}'),
        ("/v1/chat/completions", b""),
        ("/generate", b""),
    ],
)
async def test_bad_input_is_400_with_sglang_error_body(
    emu: EmulatorServer, http: aiohttp.ClientSession, path: str, body: bytes
) -> None:
    async with http.post(emu.url + path, data=body) as r:
        assert r.status == 400
        err = await r.json()
    assert err["object"] == "error" and err["code"] == 400 and err["message"]


async def test_context_length_message(emu: EmulatorServer, http: aiohttp.ClientSession) -> None:
    body = {"prompt": "x y", "max_tokens": 40000}
    async with http.post(emu.url + "/v1/completions", json=body) as r:
        err = await r.json()
    assert "maximum context length of 32768 tokens" in err["message"]


async def test_queue_overflow_answers_503() -> None:
    settings = EmulatorSettings(
        profile="seed-2k", time_scale=1.0, max_running_requests=1, max_queued_requests=2
    )
    server = await start_emulator(settings)
    try:
        async with aiohttp.ClientSession() as http:

            async def one() -> int:
                body = {"text": "q r s", "sampling_params": {"max_new_tokens": 30}}
                async with http.post(server.url + "/generate", json=body) as r:
                    return r.status

            first = {"text": "q r s", "sampling_params": {"max_new_tokens": 30}, "stream": True}
            async with http.post(server.url + "/generate", json=first) as running:
                await running.content.readline()  # it runs: the queue is empty again
                tasks = [asyncio.create_task(one()) for _ in range(5)]
                statuses = sorted(await asyncio.gather(*tasks))
                assert statuses.count(200) == 2  # two queued behind the running one
                assert statuses.count(503) == 3
                async for _ in running.content:
                    pass
            body = {"text": "q", "sampling_params": {"max_new_tokens": 1}}
            async with http.post(server.url + "/generate", json=body) as r:
                assert r.status == 200  # the queue drained
    finally:
        await server.aclose()


async def test_metrics_move_and_names_match_the_kept_list(
    emu: EmulatorServer, http: aiohttp.ClientSession
) -> None:
    before = await _metrics(http, emu)
    assert before["sglang:num_requests_total"] == 0
    body = {"text": "m n o", "sampling_params": {"max_new_tokens": 400}, "stream": True}
    async with http.post(emu.url + "/generate", json=body) as r:
        await r.content.readline()
        during = await _metrics(http, emu)
        assert during["sglang:num_running_reqs"] == 1
        assert during["sglang:token_usage"] > 0
        async for _ in r.content:
            pass
    after = await _metrics(http, emu)
    assert after["sglang:num_running_reqs"] == 0
    assert after["sglang:num_requests_total"] == 1
    assert after["sglang:prompt_tokens_total"] == 3
    assert after["sglang:generation_tokens_total"] == 400
    assert after["sglang:time_to_first_token_seconds_count"] == 1
    assert after["sglang:inter_token_latency_seconds_count"] == 399
    assert after["sglang:e2e_request_latency_seconds_count"] == 1
    assert after["sglang:gen_throughput"] > 0
    async with http.get(emu.url + "/metrics") as r:
        text = await r.text()
    emitted = set()
    for fam in text_string_to_metric_families(text):
        assert all(s.labels.get("model_name") == "emulated-model" for s in fam.samples)
        if fam.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, emitted by SGLang too
        emitted.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    kept = {
        line.strip()
        for line in NAMES_FILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert emitted == kept


async def test_info_load_health_and_flush(emu: EmulatorServer, http: aiohttp.ClientSession) -> None:
    for path in ("/get_server_info", "/server_info"):
        async with http.get(emu.url + path) as r:
            info = await r.json()
        assert info["max_total_num_tokens"] == 200_000
        assert info["max_running_requests"] == 64
        assert info["internal_states"][0]["max_total_num_tokens"] == 200_000
    async with http.get(emu.url + "/health") as r:
        assert r.status == 200
    async with http.get(emu.url + "/health_generate") as r:
        assert r.status == 200
    body = {"text": "u v w", "sampling_params": {"max_new_tokens": 300}, "stream": True}
    async with http.post(emu.url + "/generate", json=body) as r:
        await r.content.readline()
        async with http.get(emu.url + "/get_load") as lr:
            load = await lr.json()
        assert load[0]["num_reqs"] == 1 and load[0]["num_tokens"] > 0
        async with http.post(emu.url + "/flush_cache") as fr:
            assert fr.status == 400  # requests are running
        async for _ in r.content:
            pass
    async with http.post(emu.url + "/flush_cache") as fr:
        assert fr.status == 200
    assert emu.scheduler.cache.total_size == 0


async def test_port_in_use_fails_to_start_and_cleans_up(emu: EmulatorServer) -> None:
    with pytest.raises(OSError):
        await start_emulator(EmulatorSettings(profile="seed-2k", port=emu.port))
