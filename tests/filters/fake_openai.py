"""A tiny OpenAI-compatible backend for tests and benchmarks: it records what it received and
answers chat completions (JSON or SSE, with usage when asked) and SGLang ``/generate``."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.helpers import free_port

__all__ = ["FakeOpenAI"]


@dataclass
class FakeOpenAI:
    name: str = "fake"
    port: int = 0
    words: int = 5  # answer length in tokens (capped by max_tokens)
    gap: float = 0.0  # seconds between streamed chunks
    seen: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    spans: list[tuple[float, float, dict[str, str], int]] = field(default_factory=list)
    record: bool = True
    fail_status: int = 0  # answer every chat request with this error status (0: don't)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m1", "object": "model"}]})

    def _note(self, request: web.Request, body: dict[str, Any]) -> None:
        if self.record:
            self.seen.append(({k.lower(): v for k, v in request.headers.items()}, body))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        start = time.monotonic()
        resp = await self._answer(request)
        if self.record:
            total = int(resp.headers.get("x-usage-total", "0"))
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.spans.append((start, time.monotonic(), headers, total))
        return resp

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self._note(request, body)
        if self.fail_status:
            err = {"object": "error", "message": "injected failure", "type": "Internal Server Error",
                   "param": None, "code": self.fail_status}  # fmt: skip
            return web.json_response(err, status=self.fail_status)
        n = min(self.words, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        msgs = body.get("messages") or [{"content": body.get("prompt", "")}]
        prompt = sum(len(str(m.get("content", "")).split()) + 3 for m in msgs)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        base = {"id": "cmpl-1", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "m1")}  # fmt: skip
        headers = {"x-backend": self.name, "x-usage-total": str(prompt + n)}
        if not body.get("stream"):
            return web.json_response(
                {**base, "choices": [{"index": 0, "message": {"role": "assistant",
                 "content": " ".join(["w"] * n)}, "finish_reason": "length"}], "usage": usage},
                headers=headers,
            )  # fmt: skip
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        base["object"] = "chat.completion.chunk"

        async def send(obj: Any) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            if self.gap:
                await asyncio.sleep(self.gap)

        await send(
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        )
        for _ in range(n):
            await send({**base, "choices": [{"index": 0, "delta": {"content": "w "}}]})
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({**base, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _generate(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self._note(request, body)
        n = min(self.words, int((body.get("sampling_params") or {}).get("max_new_tokens", 128)))
        prompt = len(str(body.get("text", "")).split())
        return web.json_response(
            {"text": " ".join(["w"] * n), "meta_info": {"prompt_tokens": prompt,
             "completion_tokens": n, "cached_tokens": 0}},
            headers={"x-backend": self.name},
        )  # fmt: skip
