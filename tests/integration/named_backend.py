"""A tiny OpenAI-style backend process that names itself: ``python -m
tests.integration.named_backend --port P --name b0``. Each answer carries ``x-backend`` (who
served it) and ``x-seen-reserve`` (the reservation the gateway forwarded), and a usage block so
the gateway settles (none when the request has ``x-no-usage``: the reservation stays charged);
``GET /health`` answers 200."""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

__all__ = ["main"]


def _app(name: str, delay: float) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        if request.path == "/health":
            return web.Response(text="ok")
        if request.path == "/metrics":
            return web.Response(status=404)
        body = await request.read()
        if delay:
            await asyncio.sleep(delay)
        usage = {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": name}}],
        }
        if "x-no-usage" not in request.headers:  # without usage the gateway keeps the worst case
            answer["usage"] = usage
        headers = {
            "x-backend": name,
            "x-seen-reserve": request.headers.get("x-tokenweir-reserve", ""),
            "x-body-bytes": str(len(body)),
        }
        return web.Response(
            text=json.dumps(answer), content_type="application/json", headers=headers
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    web.run_app(
        _app(args.name, args.delay), host="127.0.0.1", port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
