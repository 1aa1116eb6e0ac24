"""The running emulator under overload answers as SGLang does: the waiting queue grows in
/metrics, and past --max-queued-requests a plain request gets 503 while a streamed one gets
SGLang's error event inside a 200 stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from poolstate import parse_metrics_text

pytestmark = pytest.mark.integration

FULL = "The request queue is full."


@pytest.fixture
async def emu() -> AsyncIterator[EmulatorServer]:
    settings = EmulatorSettings(
        profile="seed-2k", time_scale=1.0, max_running_requests=1, max_queued_requests=1
    )
    server = await start_emulator(settings)
    yield server
    await server.aclose()


async def test_queue_grows_then_rejections_look_like_sglangs(emu: EmulatorServer) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000}
    async with aiohttp.ClientSession() as http:

        async def hold() -> None:
            async with http.post(
                f"{emu.url}/v1/chat/completions", json={**chat, "stream": True}
            ) as r:
                async for _ in r.content:
                    pass

        async def queue_len() -> tuple[int | None, int | None]:
            async with http.get(f"{emu.url}/metrics") as r:
                s = parse_metrics_text(await r.text())
            return s.running, s.queued

        load = [asyncio.create_task(hold())]
        while await queue_len() != (1, 0):
            await asyncio.sleep(0.02)
        load.append(asyncio.create_task(hold()))
        while await queue_len() != (1, 1):
            await asyncio.sleep(0.02)
        try:
            async with http.post(f"{emu.url}/v1/chat/completions", json=chat) as r:
                assert r.status == 503
                body = await r.json()
            assert body["message"] == FULL and body["code"] == 503 and body["object"] == "error"

            async with http.post(
                f"{emu.url}/v1/chat/completions", json={**chat, "stream": True}
            ) as r:
                assert r.status == 200
                events = [e for e in (await r.text()).split("\n\n") if e]
            assert events[-1] == "data: [DONE]" and len(events) == 2
            error = json.loads(events[0].removeprefix("data: "))
            assert error == {
                "object": "error",
                "message": FULL,
                "type": "SERVICE_UNAVAILABLE",
                "param": None,
                "code": 503,
            }

            gen = {"text": "hi", "sampling_params": {"max_new_tokens": 5}, "stream": True}
            async with http.post(f"{emu.url}/generate", json=gen) as r:
                assert r.status == 200
                first = (await r.text()).split("\n\n")[0]
            reason = json.loads(first.removeprefix("data: "))["meta_info"]["finish_reason"]
            assert reason == {"type": "abort", "message": FULL, "status_code": 503}
            assert await queue_len() == (1, 1)  # rejected requests never entered the queue
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
