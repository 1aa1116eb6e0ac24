"""Parse and check LLM request bodies: OpenAI chat/completions, completions, embeddings, SGLang
``/generate``.

Pure functions. Every problem raises :class:`~filters.errors.ClientError` with an OpenAI-style
message, a ``param`` and a short metric ``reason``; nothing else escapes :func:`parse_request`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from filters.errors import ClientError
from wire.jsontypes import JsonObject, JsonValue

__all__ = [
    "MAX_TOKENS_LIMIT",
    "Decoded",
    "Kind",
    "LlmRequest",
    "Parsed",
    "body_json",
    "check_request",
    "decode_json",
    "dump_body",
    "empty_body",
    "json_of",
    "kind_for_path",
    "parse_request",
    "request_of",
    "write_body",
]

Kind = Literal["chat", "completion", "generate", "embedding"]
MAX_TOKENS_LIMIT = 1_000_000  # above this a max_tokens value is absurd, not merely large
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_SGLANG_EXTRAS = frozenset(
    {
        "top_k", "min_p", "min_tokens", "regex", "ebnf", "json_schema", "repetition_penalty",
        "stop_token_ids", "no_stop_trim", "ignore_eos", "skip_special_tokens", "lora_path",
        "session_params", "separate_reasoning", "stream_reasoning", "chat_template_kwargs",
        "rid", "return_hidden_states", "continue_final_message", "custom_params",
    }
)  # fmt: skip
_COMMON = frozenset(
    {
        "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
        "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "seed",
    }
)  # fmt: skip
_FIELDS: dict[Kind, frozenset[str]] = {
    "chat": _COMMON
    | _SGLANG_EXTRAS
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "functions",
        "function_call",
        "metadata",
        "store",
        "reasoning_effort",
        "service_tier",
        "modalities",
        "prediction",
    },
    "completion": _COMMON | _SGLANG_EXTRAS | {"prompt", "echo", "best_of", "suffix"},
    "embedding": frozenset(
        {"model", "input", "encoding_format", "dimensions", "user", "rid", "priority"}
    ),
    "generate": frozenset(
        {
            "model",
            "text",
            "input_ids",
            "sampling_params",
            "stream",
            "rid",
            "return_logprob",
            "logprob_start_len",
            "top_logprobs_num",
            "return_text_in_logprobs",
            "lora_path",
            "session_params",
            "custom_logit_processor",
            "return_hidden_states",
            "image_data",
        }
    ),
}


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """A checked request. ``data`` is the decoded JSON object (rewritten by the tokens plugin)."""

    kind: Kind
    data: JsonObject
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    max_tokens_field: (
        str  # "max_tokens", "max_completion_tokens" or "sampling_params.max_new_tokens"
    )
    prompt_text: str  # the rendered prompt (chat: roles and contents in order)
    prefix_text: str  # system prompt + the conversation up to the first non-system message
    input_ids: tuple[int, ...] | None = None  # when the prompt came as token ids


def kind_for_path(path: str) -> Kind | None:
    """The body kind a request path carries, or None for paths the plugins pass through."""
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith("/chat/completions"):
        return "chat"
    if p.endswith("/completions"):
        return "completion"
    if p.endswith("/generate"):
        return "generate"
    if p.endswith("/embeddings"):
        return "embedding"
    return None


def _bad(message: str, reason: str, param: str | None = None, status: int = 400) -> ClientError:
    return ClientError(status, message, reason=reason, param=param)


def _reject_constant(name: str) -> JsonValue:
    raise ValueError(f"{name} is not valid JSON")


def empty_body() -> ClientError:
    return _bad("the request body is empty; send a JSON object", "empty_body")


def decode_json(body: bytes) -> JsonObject:
    """The body as a JSON object; 400 on an empty body, invalid UTF-8 (lone surrogates written
    as ``\\ud800`` escapes included: no backend can encode them), malformed or non-object JSON.

    msgspec reads the bytes first (in C, without a decoded copy of the text: 0.2x the standard
    library's time on a 300 KB prompt in raw UTF-8, 0.4x at 3-71 KB; ``bench/body_decode.py``). It
    accepts strict RFC 8259 JSON only, and decodes what it accepts as the standard library does;
    everything it refuses (NaN and Infinity, lone surrogates, numbers out of range, invalid UTF-8,
    too deep, malformed) is read again by :func:`_decode_checked`, the standard library's reading,
    so every answer, error message included, is what it was."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.MsgspecError, RecursionError):
        return _decode_checked(body)
    if not isinstance(data, dict):
        raise _bad("the request body must be a JSON object", "bad_json")
    return data


def _decode_checked(body: bytes) -> JsonObject:
    if not body.strip():
        raise empty_body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"the request body is not valid UTF-8 ({exc.reason})", "bad_utf8") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise _bad("the request body nests too deeply", "bad_json") from exc
    except ValueError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}", "bad_json") from exc
    if not isinstance(data, dict):
        raise _bad("the request body must be a JSON object", "bad_json")
    if _has_surrogate_escape(text):
        _check_surrogates(data)
    return data


# a \uD800-\uDFFF escape (not preceded by an escaped backslash: ``\\ud800`` is the text
# "\ud800"); only then can the decoded strings hold a surrogate (a pair decodes to one astral
# character, a lone one stays a surrogate that UTF-8 cannot encode)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")  # a literal prefix: a fast scan


def _has_surrogate_escape(text: str) -> bool:
    """A ``\\uD800``-``\\uDFFF`` escape preceded by an even number of backslashes."""
    m = _SURROGATE_ESCAPE.search(text)
    while m is not None:
        i = m.start()
        j = i
        while j > 0 and text[j - 1] == "\\":
            j -= 1
        if (i - j) % 2 == 0:
            return True
        m = _SURROGATE_ESCAPE.search(text, i + 1)
    return False


def _check_surrogates(data: JsonObject) -> None:
    try:  # msgspec encodes to UTF-8 in C: ~10x faster than json.dumps + encode on long prompts
        msgspec.json.encode(data)
    except UnicodeEncodeError as exc:
        raise _bad(
            "the request body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff"
            " escape): it is not valid Unicode text",
            "bad_utf8",
        ) from exc


def dump_body(data: Mapping[str, object]) -> bytes:
    """Serialize a (rewritten) body as compact UTF-8 JSON (msgspec: ~10x faster than the
    standard library on long prompts). :func:`decode_json` refused lone surrogates, so every
    string encodes."""
    return msgspec.json.encode(data)


def _int_field(value: object, param: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{param} must be an integer", "bad_field", param)
    if not low <= value <= high:
        raise _bad(f"{param} must be between {low} and {high}, got {value}", "bad_field", param)
    return value


def _opt_bool(data: Mapping[str, object], key: str) -> bool:
    value = data.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"{key} must be a boolean", "bad_field", key)
    return value


def _one_completion(data: Mapping[str, object], key: str = "n") -> None:
    n = data.get(key)
    if n is not None and _int_field(n, key, low=1, high=MAX_TOKENS_LIMIT) != 1:
        raise _bad(
            f"{key}={n} is not supported by this gateway: send one request per completion",
            "n_gt_1",
            key,
        )


def _content_text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _bad(f"{param}[{i}] must be an object with a 'type'", "bad_field", param)
            if part["type"] == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad(f"{param}[{i}].text must be a string", "bad_field", param)
                parts.append(text)
            else:
                parts.append(f"[{part['type']}]")
        return "\n".join(parts)
    raise _bad(f"{param} must be a string or a list of content parts", "bad_field", param)


def _render_chat(messages: object) -> tuple[str, str]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "bad_field", "messages")
    chunks: list[str] = []
    prefix_end = 0
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _bad(f"{param} must be an object", "bad_field", param)
        role = msg.get("role")
        if role not in _ROLES:
            raise _bad(f"{param}.role must be one of {sorted(_ROLES)}", "bad_field", param)
        text = _content_text(msg.get("content"), f"{param}.content")
        if msg.get("tool_calls") is not None:
            text += json.dumps(msg["tool_calls"], separators=(",", ":"))
        chunks.append(f"<|{role}|>\n{text}\n")
        if prefix_end == 0 and role not in ("system", "developer"):
            prefix_end = len(chunks)
    rendered = "".join(chunks)
    prefix = "".join(chunks[: prefix_end or len(chunks)])
    return rendered, prefix


def _ids(value: object, param: str) -> tuple[int, ...] | None:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return tuple(value)
    return None


def _single_prompt(value: object, param: str) -> tuple[str, tuple[int, ...] | None]:
    """A prompt given as a string, a one-element list of strings, or token ids."""
    if isinstance(value, str):
        return value, None
    ids = _ids(value, param)
    if ids is not None:
        return "", ids
    if isinstance(value, list) and len(value) == 1:
        return _single_prompt(value[0], param)
    if isinstance(value, list) and len(value) > 1:
        raise _bad(
            f"{param} holds {len(value)} prompts: send one request per prompt", "n_gt_1", param
        )
    raise _bad(f"{param} must be a string or a list of token ids", "bad_field", param)


def _check_fields(kind: Kind, data: Mapping[str, object], extra: Collection[str]) -> None:
    allowed = _FIELDS[kind]
    for key in data:
        if key not in allowed and key not in extra:
            raise _bad(f"Unrecognized request argument supplied: {key}", "unknown_field", key)


def _model(data: Mapping[str, object], required: bool) -> str | None:
    model = data.get("model")
    if model is None and not required:
        return None
    if not isinstance(model, str) or not model or len(model) > 256:
        raise _bad("model must be a non-empty string", "bad_field", "model")
    return model


def parse_request(
    kind: Kind, body: bytes, *, extra_fields: Collection[str] = (), reject_unknown: bool = True
) -> LlmRequest:
    """Decode and check one request body of ``kind`` (no context: tests and benchmarks; the
    plugins decode through the request's context, :func:`body_json`)."""
    return check_request(
        kind, decode_json(body), extra_fields=extra_fields, reject_unknown=reject_unknown
    )


def check_request(
    kind: Kind, data: JsonObject, *, extra_fields: Collection[str] = (), reject_unknown: bool = True
) -> LlmRequest:
    """Check one decoded request body of ``kind``; ``data`` becomes the request's ``data``
    (not copied)."""
    if reject_unknown:
        _check_fields(kind, data, extra_fields)
    if kind == "generate":
        return _parse_generate(data)
    if kind == "embedding":
        return _parse_embedding(data)
    model = _model(data, required=True)
    _one_completion(data)
    if kind == "completion":
        _one_completion(data, "best_of")
        if "prompt" not in data:
            raise _bad("prompt is required", "bad_field", "prompt")
        prompt, ids = _single_prompt(data["prompt"], "prompt")
        rendered, prefix = prompt, prompt
    else:
        rendered, prefix = _render_chat(data.get("messages"))
        ids = None
    field_name = "max_tokens"
    max_tokens = None
    for key in ("max_tokens", "max_completion_tokens"):  # backends prefer the latter: so do we
        if data.get(key) is not None:
            max_tokens = _int_field(data[key], key, low=1, high=MAX_TOKENS_LIMIT)
            field_name = key
    stream = _opt_bool(data, "stream")
    opts = data.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options must be an object", "bad_field", "stream_options")
    include_usage = bool(stream and opts and _opt_bool(opts, "include_usage"))
    return LlmRequest(
        kind=kind,
        data=data,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_field=field_name,
        prompt_text=rendered,
        prefix_text=prefix,
        input_ids=ids,
    )


@dataclass(frozen=True, slots=True)
class Decoded:
    """One decode of a request body: the bytes it came from and what they gave, the JSON
    object or the 400 they earned. The request's context keeps the latest (``ctx.decoded``), so
    the plugins after the first read it instead of decoding again; a plugin that rewrites the
    body keeps it current (:func:`write_body`), and bytes it does not match are decoded anew."""

    raw: bytes
    result: JsonObject | ClientError


class Parsed(Protocol):
    """What this module reads and writes of a request's context (:class:`filters.api.Context`)."""

    path: str
    body: LlmRequest | None
    decoded: Decoded | None


def body_json(ctx: Parsed, body: bytes) -> JsonObject:
    """``body`` as a JSON object (:func:`decode_json`, its 400s included), decoded at most once
    per request: the decode kept on the context when it came from these bytes (the same object,
    or equal ones), else decoded here and kept. The object is shared: a plugin that changes it
    writes the body with :func:`write_body`."""
    d = ctx.decoded
    if d is None or (d.raw is not body and d.raw != body):
        try:
            d = Decoded(body, decode_json(body))
        except ClientError as exc:
            d = Decoded(body, exc)
        ctx.decoded = d
    if isinstance(d.result, ClientError):
        raise d.result
    return d.result


def json_of(ctx: Parsed, body: bytes) -> JsonObject | None:
    """:func:`body_json`, or None where the body is no JSON object (plugins that leave such a
    body alone: the backend answers it)."""
    try:
        return body_json(ctx, body)
    except ClientError:
        return None


def write_body(ctx: Parsed, data: JsonObject) -> bytes:
    """``data`` (a body's object, changed) as the request's new body (:func:`dump_body`), kept
    as the context's decode of those bytes: the plugins after this one read it undecoded."""
    new = dump_body(data)
    ctx.decoded = Decoded(new, data)
    return new


def request_of(ctx: Parsed, body: bytes) -> LlmRequest | None:
    """The request's parsed body, read once per request: the one already in ``ctx.body`` (the
    tokens plugin keeps its checked parse there), else ``body`` checked here leniently (unknown
    fields pass: only the tokens plugin refuses them) and kept in ``ctx.body`` for the plugins
    after this one. None on a path that carries no LLM body. The one side effect of this module:
    the parse is the request's, so it lives on its context."""
    if ctx.body is not None:
        return ctx.body
    kind = kind_for_path(ctx.path)
    if kind is None:
        return None
    req = check_request(kind, body_json(ctx, body), reject_unknown=False)
    ctx.body = req
    return req


def _parse_generate(data: JsonObject) -> LlmRequest:
    model = _model(data, required=False)
    if ("text" in data) == ("input_ids" in data):
        raise _bad("give exactly one of text or input_ids", "bad_field", "text")
    if "text" in data:
        text, ids = _single_prompt(data["text"], "text")
        if ids is not None:
            raise _bad("text must be a string", "bad_field", "text")
    else:
        text, ids = "", _ids(data["input_ids"], "input_ids")
        if ids is None:
            raise _bad("input_ids must be a non-empty list of integers", "bad_field", "input_ids")
    params = data.get("sampling_params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _bad("sampling_params must be an object", "bad_field", "sampling_params")
    _one_completion(params)
    max_tokens = None
    if params.get("max_new_tokens") is not None:
        max_tokens = _int_field(
            params["max_new_tokens"], "sampling_params.max_new_tokens", low=1, high=MAX_TOKENS_LIMIT
        )
    stream = _opt_bool(data, "stream")
    return LlmRequest(
        kind="generate",
        data=data,
        model=model,
        stream=stream,
        include_usage=True,  # /generate reports usage in meta_info of every chunk
        max_tokens=max_tokens,
        max_tokens_field="sampling_params.max_new_tokens",
        prompt_text=text,
        prefix_text=text,
        input_ids=ids,
    )


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of one embeddings request


def _parse_embedding(data: JsonObject) -> LlmRequest:
    """``/v1/embeddings``: ``input`` a string, a list of strings, token ids or a list of token-id
    lists (OpenAI's four forms); the prompt is every item (their texts joined, or all their
    ids): an embedding costs its prompt tokens and generates none."""
    model = _model(data, required=True)
    what = "must be a non-empty string, a list of strings, or (lists of) token ids"
    value = data.get("input")
    if value is None:
        raise _bad("input is required", "bad_field", "input")
    items = [value] if isinstance(value, str) or _ids(value, "input") is not None else value
    if not isinstance(items, list) or not items:
        raise _bad(f"input {what}", "bad_field", "input")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise _bad(
            f"input holds {len(items)} items; at most {MAX_EMBEDDING_INPUTS}", "bad_field", "input"
        )
    texts: list[str] = []
    ids: list[int] = []
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            texts.append(item)
            continue
        item_ids = _ids(item, "input")
        if item_ids is None or any(t < 0 for t in item_ids):
            raise _bad(f"input[{i}] {what}", "bad_field", "input")
        ids.extend(item_ids)
    if texts and ids:
        raise _bad("input mixes strings and token ids: send one kind", "bad_field", "input")
    for key in ("encoding_format", "dimensions"):
        v = data.get(key)
        if key == "encoding_format" and v is not None and v not in ("float", "base64"):
            raise _bad("encoding_format must be 'float' or 'base64'", "bad_field", key)
        if key == "dimensions" and v is not None:
            _int_field(v, key, low=1, high=MAX_TOKENS_LIMIT)
    text = "\n".join(texts)
    return LlmRequest(
        kind="embedding",
        data=data,
        model=model,
        stream=False,
        include_usage=False,
        max_tokens=None,
        max_tokens_field="max_tokens",  # none: an embedding generates nothing
        prompt_text=text,
        prefix_text=text,
        input_ids=tuple(ids) if ids else None,
    )
