"""Request spans of the emulator, as SGLang's ``--enable-trace --otlp-traces-endpoint`` makes:
the caller's ``traceparent`` (W3C) becomes the parent of one span per generation request, with
the GenAI semantic-convention attributes of what the server did (prompt, completion and cached
tokens, time to first token, finish reason). Off unless ``--enable-trace``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web
from opentelemetry.trace import Span

from backends.emulator.request import EmuRequest
from runtime import tracing as t

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

__all__ = ["end_request_span", "start_request_span"]

_SPAN = "tokenweir.span"
_REQ = "tokenweir.emu_request"


def start_request_span(tracing: t.Tracing, http: web.Request, req: EmuRequest, model: str) -> None:
    operation = "generate" if http.path == "/generate" else (
        "chat" if http.path.endswith("/chat/completions") else "text_completion"
    )  # fmt: skip
    attrs: Mapping[str, AttributeValue] = {
        t.OPERATION: operation,
        t.REQUEST_MODEL: model,
        t.MAX_TOKENS: req.params.max_new_tokens,
        "gen_ai.response.id": req.rid,
    }
    span = tracing.start(f"sglang {operation}", http.headers.items(), attrs)
    if span is not None:
        http[_SPAN] = span
        http[_REQ] = req


def end_request_span(http: web.Request, status: int | None) -> None:
    span: Span | None = http.get(_SPAN)
    if span is None:
        return
    req: EmuRequest = http[_REQ]
    attrs: dict[str, AttributeValue] = {
        t.INPUT_TOKENS: req.prompt_len,
        t.OUTPUT_TOKENS: len(req.output_ids),
        t.CACHED_TOKENS: req.cached_tokens,
    }
    if req.finish_reason is not None:
        attrs["gen_ai.response.finish_reasons"] = [req.finish_reason]
    if req.first_token_at is not None:
        attrs["sglang.ttft_s"] = round(req.first_token_at - req.arrival, 6)
    if status is not None:
        attrs["http.response.status_code"] = status
    span.set_attributes(attrs)
    span.end()
