"""OpenAI-compatible endpoints as SGLang serves them: chat, completions, models.

Streaming (chat): a role chunk, one content delta per token, a finish chunk carrying
``finish_reason`` and ``matched_stop``, with ``stream_options.include_usage`` a usage chunk with
``"choices": []``, then ``data: [DONE]``. Completions stream the same way with ``text`` deltas.
A body's ``rid`` (SGLang's request field) names the request: its answer's ``id`` and what
``/abort_request`` takes; without one the server makes an id.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from backends.emulator.disagg import parse_bootstrap
from backends.emulator.protocol import (
    DONE,
    context_check,
    output_text,
    parse_bool,
    parse_json_object,
    parse_max_tokens,
    parse_priority,
    parse_stop,
    sse,
    stream_error_event,
    usage_json,
)
from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.shapes import ChatChoice, Completion, TextChoice
from backends.errors import RequestError, SchedulerAbortError
from wire.jsontypes import JsonValue

if TYPE_CHECKING:
    from backends.emulator.server import EmulatorServer

__all__ = ["routes"]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def routes(server: EmulatorServer) -> list[web.RouteDef]:
    api = _OpenAIApi(server)
    return [
        web.post("/v1/chat/completions", api.chat),
        web.post("/v1/completions", api.completions),
        web.get("/v1/models", api.models),
    ]


def _prompt_ids(prompt: object, encode: Callable[[str], list[int]]) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return list(prompt)
    raise RequestError(
        "prompt must be a string, a list with one string, or a list of token ids", "prompt"
    )


class _OpenAIApi:
    def __init__(self, server: EmulatorServer) -> None:
        self.server = server

    def _params(self, body: Mapping[str, object], prompt_ids: list[int]) -> GenerationParams:
        n = body.get("n", 1)
        if n not in (None, 1):
            raise RequestError("the emulator supports n = 1 only", "n")
        s = self.server.settings
        params = context_check(
            prompt_ids,
            parse_max_tokens(body, ("max_completion_tokens", "max_tokens")),
            default=s.default_max_tokens,
            context_length=self.server.profile.context_length,
            ignore_eos=parse_bool(body, "ignore_eos"),
            stop=parse_stop(body.get("stop")),
            priority=parse_priority(body),
        )
        return self.server.with_adapter(params, body, openai=True)

    @staticmethod
    def _stream_flags(body: Mapping[str, object]) -> tuple[bool, bool]:
        stream = parse_bool(body, "stream")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise RequestError("stream_options must be an object", "stream_options")
        return stream, parse_bool(opts, "include_usage")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        params = self._params(body, self.server.encode_chat(body))
        stream, include_usage = self._stream_flags(body)
        try:
            req = await self.server.open_request(
                params, _rid(body, "chatcmpl-", self.server.next_id), request, parse_bootstrap(body)
            )
        except SchedulerAbortError as exc:
            if not stream:
                raise
            return await _rejected_stream(request, str(exc))
        model = body.get("model") or self.server.settings.model
        if stream:
            return await self._stream(request, req, model, include_usage, chat=True)
        await self.server.run_to_end(req)
        _raise_scheduler_abort(req)
        choice: ChatChoice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": output_text(req.output_words),
                "reasoning_content": None,
                "tool_calls": None,
            },
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "matched_stop": req.matched_stop,
        }
        return web.json_response(self._envelope(req, model, "chat.completion", choice))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        params = self._params(body, _prompt_ids(body.get("prompt"), self.server.encode_text))
        stream, include_usage = self._stream_flags(body)
        try:
            req = await self.server.open_request(
                params, _rid(body, "cmpl-", self.server.next_id), request, parse_bootstrap(body)
            )
        except SchedulerAbortError as exc:
            if not stream:
                raise
            return await _rejected_stream(request, str(exc))
        model = body.get("model") or self.server.settings.model
        if stream:
            return await self._stream(request, req, model, include_usage, chat=False)
        await self.server.run_to_end(req)
        _raise_scheduler_abort(req)
        choice: TextChoice = {
            "index": 0,
            "text": output_text(req.output_words),
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "matched_stop": req.matched_stop,
        }
        return web.json_response(self._envelope(req, model, "text_completion", choice))

    async def models(self, request: web.Request) -> web.StreamResponse:
        s = self.server.settings
        card = {
            "id": s.model,
            "object": "model",
            "created": int(self.server.wall_clock()),
            "owned_by": s.flavor,  # "sglang" or "vllm", as each server says
            "root": s.model,
            "max_model_len": self.server.profile.context_length,
        }
        # SGLang lists each loaded adapter as a model whose parent is the base model
        adapters = [
            {**card, "id": name, "root": path, "parent": s.model}
            for name, path in self.server.lora_registry.loaded().items()
        ]
        return web.json_response({"object": "list", "data": [card, *adapters]})

    def _envelope(
        self, req: EmuRequest, model: JsonValue, obj: str, choice: ChatChoice | TextChoice
    ) -> Completion:
        return {
            "id": req.rid,
            "object": obj,
            "created": int(self.server.wall_clock()),
            "model": model,
            "choices": [choice],
            "usage": usage_json(req, cache_report=self.server.settings.enable_cache_report),
        }

    async def _stream(
        self,
        request: web.Request,
        req: EmuRequest,
        model: JsonValue,  # the request's, echoed
        include_usage: bool,
        *,
        chat: bool,
    ) -> web.StreamResponse:
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps(
            {"id": req.rid, "object": obj, "created": int(self.server.wall_clock()), "model": model}
        )[:-1]  # the envelope without its closing brace; choices are appended per chunk

        def chunk(choices: str, extra: str = "") -> bytes:
            return sse(f'{head}, "choices": {choices}{extra}}}')

        def delta(text: str) -> bytes:
            if chat:
                c = f'{{"index": 0, "delta": {{"content": {json.dumps(text)}}}, "logprobs": null, "finish_reason": null}}'
            else:
                c = f'{{"index": 0, "text": {json.dumps(text)}, "logprobs": null, "finish_reason": null}}'
            return chunk(f"[{c}]")

        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the client left; the request is aborted
            await self._stream_body(resp, req, include_usage, chat, chunk, delta)
        return resp

    async def _stream_body(
        self,
        resp: web.StreamResponse,
        req: EmuRequest,
        include_usage: bool,
        chat: bool,
        chunk: Callable[..., bytes],
        delta: Callable[[str], bytes],
    ) -> None:
        role = '{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}'
        first = True
        try:
            while True:
                await req.wait()
                words = req.take_new_words()
                if words:
                    parts: list[bytes] = []
                    if first and chat:
                        parts.append(chunk(f"[{role}]"))
                    for w in words:
                        parts.append(delta(w if first else " " + w))
                        first = False
                    await resp.write(b"".join(parts))
                if req.done and req.read_upto >= len(req.output_words):
                    break
        finally:
            if not req.done:
                self.server.scheduler.abort(req)
        if req.finish_reason == "abort":
            if req.abort_message is not None:  # as one refused at once, after what it streamed
                await resp.write(stream_error_event(503, req.abort_message))
                await resp.write_eof()
            return
        key = "delta" if chat else "text"
        empty = "{}" if chat else '""'
        finish = (
            f'{{"index": 0, "{key}": {empty}, "logprobs": null, '
            f'"finish_reason": {json.dumps(req.finish_reason)}, '
            f'"matched_stop": {json.dumps(req.matched_stop)}}}'
        )
        tail = [chunk(f"[{role}]")] if first and chat else []
        tail.append(chunk(f"[{finish}]"))
        if include_usage:
            usage = usage_json(req, cache_report=self.server.settings.enable_cache_report)
            tail.append(chunk("[]", f', "usage": {json.dumps(usage)}'))
        tail.append(DONE)
        await resp.write(b"".join(tail))
        await resp.write_eof()


def _rid(body: Mapping[str, object], prefix: str, make: Callable[[], str]) -> str:
    """The request's id: the body's ``rid`` (a string, as SGLang's OpenAI protocol takes it),
    else ``prefix`` and a fresh id."""
    rid = body.get("rid")
    if rid is None:
        return prefix + make()
    if not isinstance(rid, str) or not rid:
        raise RequestError("rid must be a non-empty string", "rid")
    return rid


def _raise_scheduler_abort(req: EmuRequest) -> None:
    """A request the scheduler aborted after taking it (a more urgent one took its place in
    the queue) is answered as one it refused: 503 with SGLang's message."""
    if req.abort_message is not None:
        raise SchedulerAbortError(req.abort_message)


async def _rejected_stream(request: web.Request, message: str) -> web.StreamResponse:
    """SGLang rejects a streamed request its queue cannot hold inside a 200 event stream."""
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    with contextlib.suppress(ConnectionResetError):
        await resp.write(stream_error_event(503, message))
        await resp.write_eof()
    return resp
