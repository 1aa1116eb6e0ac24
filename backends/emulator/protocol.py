"""Request parsing and response shapes shared by the OpenAI and native SGLang APIs.

Pure functions: JSON in, typed values out (``RequestError`` → 400), and the JSON bodies SGLang
answers with (error objects, usage blocks, SSE framing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from backends.emulator.request import EmuRequest, GenerationParams
from backends.emulator.shapes import CachedTokens, ErrorBody, Usage
from backends.errors import RequestError
from wire.jsontypes import JsonObject, JsonValue

__all__ = [
    "DONE",
    "context_check",
    "error_body",
    "output_text",
    "parse_bool",
    "parse_json_object",
    "parse_max_tokens",
    "parse_priority",
    "parse_stop",
    "sse",
    "stream_error_event",
    "usage_json",
]

DONE = b"data: [DONE]\n\n"

_STATUS_TYPES = {400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}


def stream_error_event(status: int, message: str) -> bytes:
    """What SGLang streams when the scheduler aborts a request it accepted (the queue is full):
    one SSE event with its error object, typed by the HTTP status name, then ``[DONE]``; the
    HTTP status stays 200 (the stream had begun)."""
    names = {503: "SERVICE_UNAVAILABLE", 500: "INTERNAL_SERVER_ERROR", 400: "BAD_REQUEST"}
    body = {**error_body(status, message), "type": names.get(status, "ERROR")}
    return sse(json.dumps(body)) + DONE


def error_body(status: int, message: str, param: str | None = None) -> ErrorBody:
    """SGLang's error object (``{"object": "error", ...}``)."""
    return {
        "object": "error",
        "message": message,
        "type": _STATUS_TYPES.get(status, "Error"),
        "param": param,
        "code": status,
    }


def sse(payload: str) -> bytes:
    """One server-sent event carrying ``payload`` (already JSON)."""
    return b"data: " + payload.encode() + b"\n\n"


def parse_json_object(raw: bytes) -> JsonObject:
    try:
        body: JsonValue = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) is not None:
        try:  # a lone \ud800 escape decodes to a string no tokenizer can encode
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"the body is not valid Unicode text: {exc.reason}") from exc
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def parse_max_tokens(body: Mapping[str, object], keys: Sequence[str]) -> int | None:
    """The first of ``keys`` present (a non-negative integer), or None for 'use the default'."""
    for key in keys:
        if key in body and body[key] is not None:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RequestError(f"{key} must be a non-negative integer, got {value!r}", key)
            return value
    return None


def parse_priority(body: Mapping[str, object]) -> int | None:
    """The request's ``priority`` (SGLang: an optional integer at the top of the body)."""
    value = body.get("priority")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(f"priority must be an integer, got {value!r}", "priority")
    return value


def parse_stop(value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise RequestError("stop must be a string or a list of strings", "stop")


def parse_bool(body: Mapping[str, object], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false", key)
    return value


def context_check(
    prompt_ids: Sequence[int],
    max_new: int | None,
    *,
    default: int,
    context_length: int,
    ignore_eos: bool,
    stop: frozenset[str],
    priority: int | None = None,
) -> GenerationParams:
    """Build the request's parameters; 400 (SGLang's message) when the context is exceeded."""
    prompt_len = len(prompt_ids)
    if prompt_len == 0:
        raise RequestError("the prompt is empty", "prompt")
    if max_new is None:
        max_new = min(default, max(context_length - prompt_len, 0))
    total = prompt_len + max_new
    if prompt_len >= context_length or total > context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {total} tokens: {prompt_len} "
            f"tokens from the input messages and {max_new} tokens for the completion. Please "
            f"reduce the number of tokens in the input messages or the completion to fit "
            f"within the limit."
        )
    return GenerationParams(
        prompt_ids=tuple(prompt_ids),
        max_new_tokens=max_new,
        ignore_eos=ignore_eos,
        stop=stop,
        priority=priority,
    )


def usage_json(req: EmuRequest, *, cache_report: bool) -> Usage:
    """OpenAI ``usage``; ``cached_tokens`` only with cache reporting and when > 0, as SGLang."""
    completion = len(req.output_ids)
    details: CachedTokens | None = (
        {"cached_tokens": req.cached_tokens} if cache_report and req.cached_tokens > 0 else None
    )
    return {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
    }


def output_text(words: Sequence[str]) -> str:
    return " ".join(words)
