"""An emulator process started with SGLang's ``--enable-priority-scheduling``: a high-priority
request that arrives while low-priority streams fill the batch preempts one of them and gets
its first token while they still run; every low stream then finishes with its full output."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import ChildProcess, free_port, sse_events, wait_for_port

pytestmark = pytest.mark.integration

LOW_TOKENS = 300


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "backends.emulator", "--port", str(port), "--profile", "seed-2k"]
    # time scale 0.5: a low stream runs ~1.5 s, so the high request's first token comes while
    # both still run on a loaded box too (at 0.05 one had ended first in a fresh-clone CI run)
    argv += ["--time-scale", "0.5", "--max-running-requests", "2", "--enable-priority-scheduling"]
    child = ChildProcess(argv, log=tmp_path / "emulator.log")
    try:
        wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        child.close()


@dataclass
class Stream:
    chunks: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    done: bool = False


async def _chat_stream(http: aiohttp.ClientSession, url: str, out: Stream) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": LOW_TOKENS,
        "ignore_eos": True,
        "priority": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        async for event in sse_events(r.content):
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    out.chunks += 1
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
    out.done = True


async def test_a_high_priority_request_preempts_and_every_low_one_still_completes(
    url: str,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/get_server_info") as r:
            info = await r.json()
        assert info["enable_priority_scheduling"] is True
        assert info["priority_scheduling_preemption_threshold"] == 10  # SGLang's default

        lows = [Stream(), Stream()]
        tasks = [asyncio.create_task(_chat_stream(http, url, s)) for s in lows]
        while not all(s.chunks >= 3 for s in lows):  # both run: the batch (2) is full
            await asyncio.sleep(0.01)
            assert not any(t.done() for t in tasks)

        high = {"text": "urgent", "sampling_params": {"max_new_tokens": 5}, "priority": 100}
        async with http.post(url + "/generate", json={**high, "stream": True}) as r:
            assert r.status == 200
            first = json.loads((await r.content.readline()).decode().removeprefix("data: "))
            assert first["output_ids"]  # its first token came...
            assert not any(s.done for s in lows)  # ...while both low streams were unfinished
            async for _ in r.content:
                pass

        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    for s in lows:  # the preempted one resumed; no output was lost or repeated
        assert s.finish_reason == "length"
        assert s.usage["completion_tokens"] == LOW_TOKENS
        assert s.chunks == LOW_TOKENS
