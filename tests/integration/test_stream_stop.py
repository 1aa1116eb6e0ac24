"""The in-stream stop end to end: real Envoy (our control plane), Redis, the rate-limit service
and the filter server as processes, the SGLang emulator as the backend, the official ``openai``
client. Reservations are made far too low on purpose (``lowball_plugin.py``: the prompt + 8
tokens, and the client's ``max_tokens`` reaches the backend unclamped); the usage plugin's
``stop_at_budget`` must still keep every tenant inside its budget: streams are cut where the
budget ends (``finish_reason: length``, the usage chunk, ``[DONE]``) and the emulator is told
to abort them; a non-streamed request reserves all of its ``max_tokens``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from backends.emulator import EmulatorServer, EmulatorSettings, start_emulator
from tests.helpers import free_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BURST, REFILL = 600, 1.0
MAX_TOKENS = 300


def policy_text(gw: int, fp: int, rp: int, redis_url: str, emu: int, stop: bool) -> str:
    usage = f"{{name: usage, settings: {{stop_at_budget: {str(stop).lower()}, topup_tokens: 32}}}}"
    plugins = f"identity, tokens, tests.integration.lowball_plugin:Lowball, {usage}"
    routes = [metered_route(plugins=plugins),
              metered_route("generate", match="{path: /generate}", plugins=plugins)]  # fmt: skip
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, pools={"chat": ("m1", emu)}, routes=routes,
        rest=token_tier(BURST, {"carol": "carol-key-123"}, max_tokens=1000, refill=REFILL),
    )  # fmt: skip


@dataclass
class Stack:
    url: str
    client: AsyncOpenAI
    emu: EmulatorServer
    log: Path
    redis: aioredis.Redis

    def finished(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    async def bucket(self) -> float:
        tk = await self.redis.hget("tw:{carol}:b:tokens", "tk")
        return float(tk) if tk is not None else float(BURST)


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, redis_port: int, *, stop: bool = True, transport: str = "h2"
) -> AsyncIterator[Stack]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    log = tmp_path / "emulator-requests.jsonl"
    emu = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.5, seed=3, request_log=str(log))
    )
    gw, fp, rp = free_port(), free_port(), free_port()
    text = policy_text(gw, fp, rp, redis_url, emu.port, stop)
    ports, extra = {"ratelimit_service": rp, "filters": fp}, {"filters": ["--transport", transport]}
    try:
        async with (
            mesh(tmp_path, text, {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, timeout=40.0, extra=extra),
        ):
            client = AsyncOpenAI(
                base_url=f"http://127.0.0.1:{gw}/v1", api_key="carol-key-123", max_retries=0
            )
            yield Stack(f"http://127.0.0.1:{gw}", client, emu, log, r)
            await client.close()
    finally:
        await emu.aclose()
        await r.aclose()


@dataclass
class Streamed:
    text_tokens: int
    finish: str | None
    usage: openai.types.CompletionUsage | None
    rid: str


async def stream(client: AsyncOpenAI, max_tokens: int = MAX_TOKENS) -> Streamed:
    s = await client.chat.completions.create(
        model="m1",
        messages=[{"role": "user", "content": "tell me about weirs"}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    n, finish, usage, rid = 0, None, None, ""
    async for chunk in s:  # the client stops at [DONE]: it raises if the stream breaks
        rid = rid or chunk.id
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                n += 1
            finish = c.finish_reason or finish
    return Streamed(n, finish, usage, rid)


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_a_stream_is_cut_at_the_budget_and_the_backend_aborts(
    tmp_path: Path, redis_port: int, transport: str
) -> None:
    async with stack(tmp_path, redis_port, transport=transport) as st:
        # three answers of 300 tokens on a 600-token budget (8 + prompt reserved for each):
        # the budget cannot hold them; each draws top-ups of 32 as it streams, and is cut
        # where the budget ends, a hundred tokens or so before its end
        runs = await asyncio.gather(*(stream(st.client) for _ in range(3)))
        cut = [x for x in runs if x.text_tokens < MAX_TOKENS - 20]
        assert cut, runs
        for x in runs:
            assert x.finish == "length" and x.usage is not None
            assert x.usage.completion_tokens == x.text_tokens  # the usage chunk tells the truth
        # the emulator was told: the cut requests stopped generating before their 300 tokens
        await asyncio.sleep(0.5)
        assert st.emu.abort_requests["aborted"] >= len(cut)
        done = {str(line["rid"]): line for line in st.finished()}
        for x in cut:
            line = done[x.rid]
            assert line["finish"] == "abort", line
            assert int(str(line["output_tokens"])) < MAX_TOKENS, line
        # 0 overshoot: the bucket never goes below what was refilled meanwhile
        assert await st.bucket() >= -1.0


async def completions_stream(client: AsyncOpenAI) -> Streamed:
    s = await client.completions.create(
        model="m1", prompt="tell me about weirs", max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    n, finish, usage, rid = 0, None, None, ""
    async for chunk in s:
        rid = rid or chunk.id
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            n += 1 if c.text else 0
            finish = c.finish_reason or finish
    return Streamed(n, finish, usage, rid)


async def generate_stream(url: str) -> dict[str, object]:
    """The last event of a streamed ``/generate`` (cumulative text), after checking [DONE]."""
    body = {"text": "tell me about weirs", "stream": True,
            "sampling_params": {"max_new_tokens": MAX_TOKENS}}  # fmt: skip
    headers = {"authorization": "Bearer carol-key-123"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/generate", json=body, headers=headers) as r,
    ):
        assert r.status == 200
        raw = await r.read()
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", events[-3:]
    last: dict[str, object] = json.loads(events[-2])
    return last


async def test_completions_and_generate_streams_are_cut_too(
    tmp_path: Path, redis_port: int
) -> None:
    async with stack(tmp_path, redis_port) as st:
        runs = await asyncio.gather(*(completions_stream(st.client) for _ in range(3)))
        assert any(x.text_tokens < MAX_TOKENS - 20 for x in runs), runs
        for x in runs:
            assert x.finish == "length" and x.usage is not None
            assert x.usage.completion_tokens == x.text_tokens
        await asyncio.sleep(0.5)
        aborted = st.emu.abort_requests["aborted"]
        assert aborted >= 1
        await st.redis.delete("tw:{carol}:b:tokens")  # a full bucket again
        gens = await asyncio.gather(*(generate_stream(st.url) for _ in range(3)))
        counts = []
        for g in gens:
            meta = g["meta_info"]
            assert isinstance(meta, dict)
            n = int(meta["completion_tokens"])
            assert meta["finish_reason"] == {"type": "length", "length": n}
            assert len(str(g["text"]).split()) == n  # the text served is what is counted
            counts.append(n)
        assert min(counts) < MAX_TOKENS - 20, counts
        await asyncio.sleep(0.5)
        assert st.emu.abort_requests["aborted"] > aborted


async def test_a_non_streamed_request_reserves_its_max_tokens(
    tmp_path: Path, redis_port: int
) -> None:
    async with stack(tmp_path, redis_port) as st:
        # whole: within the budget, answered in full
        resp = await st.client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=200
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 200
        # more than the budget still holds (~400 left): refused before the backend is asked,
        # though the (lowball) reservation alone would have fitted
        with pytest.raises(openai.RateLimitError):
            await st.client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=900
            )
        assert len(st.finished()) == 1


@pytest.mark.parametrize("stop", [True, False], ids=["stop", "no_stop"])
async def test_parallel_long_answers_stay_inside_the_budget(
    tmp_path: Path, redis_port: int, stop: bool
) -> None:
    """Eight parallel streams of 300 tokens each, reserved at prompt + 8: without the stop they
    serve 2,400 tokens on a 600-token budget; with it, what they serve stays within the budget
    and its refill over the run (prompts counted as the backend counted them)."""
    async with stack(tmp_path, redis_port, stop=stop) as st:
        t0 = time.monotonic()
        runs = await asyncio.gather(*(stream(st.client) for _ in range(8)), return_exceptions=True)
        elapsed = time.monotonic() - t0
        await asyncio.sleep(0.5)
        prompts = {str(x["rid"]): int(str(x["prompt_tokens"])) for x in st.finished()}
        served = sum(x.text_tokens + prompts.get(x.rid, 0) for x in runs if isinstance(x, Streamed))
        allowed = BURST + REFILL * elapsed
        if stop:
            assert served <= allowed, (served, allowed)
            # what the budget was charged: a stopped stream reports no usage of the backend's,
            # so its prompt is charged at the bound it was reserved at (docs/quotas.md), plus
            # what it served; the closing usage chunk says so
            charged = sum(
                x.text_tokens + (x.usage.prompt_tokens if x.usage is not None else 0)
                for x in runs
                if isinstance(x, Streamed)
            )
            assert served <= charged <= allowed, (served, charged, allowed)
            # the budget is used: at the refusal each other stream holds at most one block
            # (32) drawn and not yet served
            assert charged >= BURST - 8 * 32, charged
        else:
            assert served > 2 * allowed  # the test can fail: this is what the stop prevents
