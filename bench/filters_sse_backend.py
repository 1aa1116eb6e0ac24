"""A streaming OpenAI-style backend for bench/filters_bench.py: each SSE chunk carries the wall
time it was written (``ts``), so a client can measure what the path in between adds per chunk.

``python bench/filters_sse_backend.py --port P --gap 0.005``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

__all__ = ["main"]


def make_app(gap: float) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        n = int(body.get("max_tokens") or 16)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "c1", "object": "chat.completion.chunk", "model": body.get("model", "m1")}
        for i in range(n):
            await asyncio.sleep(gap)
            chunk = {
                **base,
                "ts": time.time(),
                "choices": [{"index": 0, "delta": {"content": f"w{i} "}}],
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n}
            await resp.write(
                b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/{tail:.*}", chat)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gap", type=float, default=0.005)
    ns = p.parse_args()
    web.run_app(make_app(ns.gap), host="127.0.0.1", port=ns.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
