"""The routing benchmark's client (bench/routing_client.py): closed loop, and open loop at a rate."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time

from aiohttp import web

from bench.routing_client import arrivals, drive


def test_arrivals_are_seeded_poisson_times() -> None:
    at = arrivals(2000, 50.0, seed=3)
    assert at == arrivals(2000, 50.0, seed=3)  # every arm gets the same times
    assert at != arrivals(2000, 50.0, seed=4)
    assert at[0] == 0.0 and all(b > a for a, b in itertools.pairwise(at))
    assert 36 < at[-1] < 44  # 1,999 gaps of 1/50 s on average: ~40 s


async def _serve(sent: list[float]) -> tuple[web.AppRunner, str]:
    """A streaming chat backend on loopback that notes when each request arrived and answers
    its first token after 50 ms."""

    async def chat(request: web.Request) -> web.StreamResponse:
        sent.append(time.perf_counter())
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.05)
        chunk = {"id": "x", "choices": [{"delta": {"content": "hi"}}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"id": "x", "choices": [], "usage": {"completion_tokens": 1}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


def _run(rate: float | None, n: int) -> tuple[dict[str, object], list[float]]:
    async def go() -> tuple[dict[str, object], list[float]]:
        sent: list[float] = []
        runner, url = await _serve(sent)
        try:
            a = argparse.Namespace(concurrency=2, rate=rate, start=1)
            return await drive(url, [("question", 1)] * n, a), sent
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_closed_loop_keeps_its_clients_busy_and_no_more() -> None:
    res, sent = _run(None, 6)
    assert res["requests"] == 6 and res["failed"] == 0 and res["offered_rate"] is None
    # two clients, each waiting 50 ms for its answers: three rounds, not one burst of six
    assert sent[-1] - sent[0] > 0.09
    assert res["ttft_p50_ms"] >= 50


def test_an_open_loop_sends_on_time_whatever_is_in_flight() -> None:
    res, sent = _run(100.0, 20)
    assert res["requests"] == 20 and res["failed"] == 0 and res["offered_rate"] == 100.0
    at = arrivals(20, 100.0, seed=1)
    # never sent before its seeded time from the run's start (a loaded machine may make it late,
    # not early); the client's own clock: the backend's arrival times carry the connection's
    # set-up, which made the first arrival late and so every later one look early …
    per_request = res["per_request"]
    assert isinstance(per_request, list) and len(per_request) == 20
    assert all(when >= at[i] - 0.001 for i, when, _, _ in per_request), (per_request, at)
    # … and not held back by the requests still open: more than the closed loop's two clients
    # had a request out at once (each is answered 50 ms after it arrives)
    overlapping = max(sum(1 for t in sent if s <= t < s + 0.05) for s in sent)
    assert overlapping > 2
