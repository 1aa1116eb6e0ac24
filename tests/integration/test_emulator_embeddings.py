"""The emulator's ``POST /v1/embeddings`` against the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from openai import AsyncOpenAI

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator

pytestmark = pytest.mark.integration


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    server = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.05, seed=7, embedding_dim=64)
    )
    yield server
    await server.aclose()


def _client(server: EmulatorServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def test_openai_client_embeddings(emu: EmulatorServer) -> None:
    async with _client(emu) as client:
        await _check_client(client)


async def _check_client(client: AsyncOpenAI) -> None:
    # the client asks for base64 and decodes it; a list of strings gives one vector each
    resp = await client.embeddings.create(model="m", input=["weirs hold water", "a second"])
    assert [d.index for d in resp.data] == [0, 1]
    assert all(len(d.embedding) == 64 for d in resp.data)
    assert abs(math.fsum(v * v for v in resp.data[0].embedding) - 1.0) < 1e-4
    assert resp.data[0].embedding != resp.data[1].embedding
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == 5
    again = await client.embeddings.create(
        model="m", input="weirs hold water", encoding_format="float"
    )
    assert again.data[0].embedding == pytest.approx(resp.data[0].embedding, abs=1e-6)
    assert again.usage.prompt_tokens == 3
    short = await client.embeddings.create(
        model="m", input=[[5, 6, 7]], dimensions=8, encoding_format="float"
    )
    assert len(short.data[0].embedding) == 8
    assert abs(math.fsum(v * v for v in short.data[0].embedding) - 1.0) < 1e-6


async def test_embeddings_take_prefill_time() -> None:
    """Each item is a prefill through the scheduler: 3,000 uncached tokens at the profile's
    10k tokens/s take 0.3 s (time_scale 1)."""
    server = await start_emulator(EmulatorSettings(profile="seed-2k", seed=7))
    try:
        text = " ".join(f"w{i}" for i in range(3000))
        async with _client(server) as client:
            t0 = time.monotonic()
            resp = await client.embeddings.create(model="m", input=text, encoding_format="float")
            took = time.monotonic() - t0
    finally:
        await server.aclose()
    assert resp.usage.prompt_tokens == 3000
    assert took >= 0.9 * server.profile.prefill_cost_s(3000)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": ["ok", 3]}, "input"),
        ({"model": "m", "input": [[1, -2]]}, "input"),
        ({"model": "m", "input": "ok", "dimensions": 65}, "dimensions"),
        ({"model": "m", "input": "ok", "encoding_format": "int8"}, "encoding_format"),
    ],
)
async def test_bad_embeddings_get_400(emu: EmulatorServer, body: object, param: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(emu.url + "/v1/embeddings", json=body) as r,
    ):
        assert r.status == 400
        err = await r.json()
    assert err["object"] == "error" and err["param"] == param and err["code"] == 400
