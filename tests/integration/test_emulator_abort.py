"""The emulator's ``POST /abort_request`` (SGLang's ``AbortReq``): the request with that rid stops
generating at once, its stream ends, an unknown rid is a no-op answered 200."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator

pytestmark = pytest.mark.integration


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    server = await start_emulator(EmulatorSettings(profile="seed-2k", time_scale=1.0, seed=7))
    yield server
    await server.aclose()


async def test_abort_request_stops_a_running_stream(emu: EmulatorServer) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "a long answer please"}],
        "max_tokens": 4000,
        "stream": True,
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(emu.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            rid, events = None, 0
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                events += 1
                rid = rid or json.loads(line[6:])["id"]
                if events == 5:
                    async with http.post(emu.url + "/abort_request", json={"rid": rid}) as a:
                        assert a.status == 200
            # the stream ended (no [DONE]) long before its 4,000 tokens
            assert 5 <= events < 200
        assert not emu.scheduler.running and not emu.scheduler.waiting
        async with http.post(emu.url + "/abort_request", json={"rid": "nobody"}) as a:
            assert a.status == 200
        async with http.post(emu.url + "/abort_request", json={"rid": 7}) as a:
            assert a.status == 400
        async with http.get(emu.url + "/_emulator/state") as s:
            state = await s.json()
    assert state["abort_requests"] == {"received": 2, "aborted": 1}


async def test_abort_all(emu: EmulatorServer) -> None:
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": 4000}}
    async with aiohttp.ClientSession() as http:
        runs = [
            asyncio.ensure_future(http.post(emu.url + "/generate", json=body)) for _ in range(3)
        ]
        while len(emu.scheduler.running) + len(emu.scheduler.waiting) < 3:
            await asyncio.sleep(0.01)
        async with http.post(emu.url + "/abort_request", json={"abort_all": True}) as a:
            assert a.status == 200
        for run in runs:
            resp = await run
            resp.release()
    assert emu.abort_requests == {"received": 1, "aborted": 3}
