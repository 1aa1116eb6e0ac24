"""End to end (issue 36): real Envoy (our control plane), real Redis, the rate-limit service,
the filter server and an SGLang emulator as processes.

A tenant with a history of short answers reserves what its answers use (its learned p95), not
its ``max_tokens``: a burst against one budget gets far more requests in than the same burst
reserved at ``max_tokens`` (before any history), every admitted answer is whole (its
``max_tokens`` untouched, ended by itself), and the rest get the rate-limit service's 429 with
``Retry-After``. Bad input (a negative or absurd ``max_tokens``, an unknown model) is a JSON
error naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.helpers import ChildProcess, free_port, wait_for_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BURST = 6000  # the tenant's bucket
MAX_TOKENS = 1024  # what each request asks for; the emulator's answers are ~10 tokens
KEYS = {"warm": "warm-key-123456", "cold": "cold-key-123456"}


def policy_text(gw: int, fp: int, rp: int, emu: int, redis_url: str) -> str:
    usage = "{name: usage, settings: {stop_at_budget: true}}"
    learned = (
        "reservation: {output: learned, quantile: 0.95, min_samples: 20, short_budget: reject}"
    )
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, pools={"chat": ("m1", emu)},
        routes=[metered_route(plugins=f"identity, tokens, prefix, lane, {usage}")],
        rest=f"{learned}\n{token_tier(BURST, KEYS, max_tokens=2048, refill=2)}",
    )  # fmt: skip


Answer = tuple[int, dict[str, str], Any]


@dataclass
class Mesh:
    url: str
    session: aiohttp.ClientSession
    redis: Any

    async def post(self, tenant: str, body: dict[str, Any]) -> Answer:
        headers = {"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"}
        async with self.session.post(
            self.url + "/v1/chat/completions", data=json.dumps(body), headers=headers
        ) as r:
            raw = await r.read()
            headers = {k.lower(): v for k, v in r.headers.items()}
            if r.status == 200 and body.get("stream"):
                return r.status, headers, _streamed(raw)
            return r.status, headers, json.loads(raw)

    async def chat(self, tenant: str, **kw: Any) -> Answer:
        msgs = [{"role": "user", "content": "Tell me briefly how a weir keeps a river steady."}]
        return await self.post(
            tenant, {"model": "m1", "messages": msgs, "max_tokens": MAX_TOKENS, **kw}
        )

    async def burst(self, tenant: str, n: int) -> list[Answer]:
        """``n`` streamed requests at once (a non-streamed answer cannot be stopped in the
        stream, so it always reserves its whole max_tokens: docs/quotas.md)."""
        stream = {"stream": True, "stream_options": {"include_usage": True}}
        return list(await asyncio.gather(*(self.chat(tenant, **stream) for _ in range(n))))

    async def settled(self, tenant: str, timeout: float = 10.0) -> None:
        """Until every admitted request of ``tenant`` is settled: the settle deletes its
        reservation record (``tw:{tenant}:r:<id>``, quota/keys.py)."""
        end = time.monotonic() + timeout
        while [k async for k in self.redis.scan_iter(match=f"tw:{{{tenant}}}:r:*")]:
            assert time.monotonic() < end, f"{tenant}'s reservations were not all settled"
            await asyncio.sleep(0.05)

    async def refill(self, tenant: str) -> None:
        await self.redis.delete(f"tw:{{{tenant}}}:b:tokens")  # docs/quotas.md: refill now


@contextlib.asynccontextmanager
async def started(tmp_path: Path, redis_port: int) -> AsyncIterator[Mesh]:
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    gw, fp, rp, emu = free_port(), free_port(), free_port(), free_port()
    children: list[ChildProcess] = []
    try:
        emulator = [sys.executable, "-m", "backends.emulator", "--port", str(emu), "--model",
                    "m1", "--stop-prob", "0.1", "--time-scale", "0.2", "--log-level", "WARNING"]  # fmt: skip
        children.append(ChildProcess(emulator, log=tmp_path / "emulator.log"))
        await asyncio.to_thread(wait_for_port, emu, 20.0)
        async with (
            mesh(tmp_path, policy_text(gw, fp, rp, emu, redis_url), {"edge": gw}) as m,
            service_processes(
                tmp_path, m.policy_path, redis_url, {"ratelimit_service": rp, "filters": fp}
            ),
            aiohttp.ClientSession() as s,
        ):
            yield Mesh(f"http://127.0.0.1:{gw}", s, r)
    finally:
        for c in children:
            c.close()
        await r.aclose()


def _streamed(raw: bytes) -> dict[str, Any]:
    """A streamed answer as the non-streamed object would say it: how it ended, its usage."""
    finish, usage = None, None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or ():
            finish = choice.get("finish_reason") or finish
        usage = event.get("usage") or usage
    return {"choices": [{"finish_reason": finish}], "usage": usage}


def _whole(answers: list[Answer]) -> list[dict[str, Any]]:
    """The admitted answers; each must be whole: ended by itself, under its max_tokens."""
    ok = [b for s, _, b in answers if s == 200]
    for b in ok:
        assert b["choices"][0]["finish_reason"] == "stop", b
        assert b["usage"]["completion_tokens"] < MAX_TOKENS
    return ok


def _refused(answers: list[Answer]) -> list[Answer]:
    """The 429s: the rate-limit service's, with Retry-After from the refill and a JSON error."""
    out = [a for a in answers if a[0] == 429]
    for _, headers, body in out:
        assert int(headers["retry-after"]) >= 1
        assert headers["x-ratelimit-quota"].startswith("tokens.")
        assert body["error"]["code"] == "rate_limit_exceeded"
    return out


async def test_a_learned_reservation_admits_whole_answers(tmp_path: Path, redis_port: int) -> None:
    async with started(tmp_path, redis_port) as m:
        # bad input first: clear JSON errors naming the field, nothing charged
        for body, status, param in (
            ({"max_tokens": -5}, 400, "max_tokens"),
            ({"max_tokens": 10**9}, 400, "max_tokens"),
            ({"model": "no-such-model"}, 404, "model"),
        ):
            s, h, b = await m.chat("cold", **body)
            assert s == status and h["content-type"].startswith("application/json"), (s, b)
            assert b["error"]["param"] == param and b["error"]["message"]

        # no history anywhere: each request reserves its prompt + max_tokens
        cold = await m.burst("cold", 60)
        cold_ok = _whole(cold)
        assert len(_refused(cold)) == 60 - len(cold_ok)
        assert 1 <= len(cold_ok) <= 2 * BURST // MAX_TOKENS

        # a history of short answers (the emulator's: ~10 tokens), then the same burst again
        for _ in range(30):
            s, _, b = await m.chat("warm")
            assert s == 200, b
        await m.refill("warm")
        warm = await m.burst("warm", 60)
        warm_ok = _whole(warm)
        refused = _refused(warm)
        print(f"admitted of 60: {len(cold_ok)} reserving max_tokens, {len(warm_ok)} learned")
        assert len(warm_ok) + len(refused) == 60
        assert len(warm_ok) >= 4 * len(cold_ok) and len(warm_ok) >= 25, (
            len(warm_ok),
            len(cold_ok),
        )

        # a request the rest of the budget cannot serve whole is refused, not cut short
        # 1 token left now, once the burst's settlements have landed (each settle refunds its
        # unused reservation into the bucket; one landing after the write below would refill it:
        # fresh-clone CI saw this) (``ts`` now too: with the burst's old ``ts`` a slow box's
        # elapsed seconds would refill it at 2 tokens/s before the check)
        await m.settled("warm")
        now_us = int(time.time() * 1_000_000)
        await m.redis.hset("tw:{warm}:b:tokens", mapping={"tk": 1, "ts": now_us})
        s, h, b = await m.chat("warm")
        assert s == 429 and _refused([(s, h, b)])
