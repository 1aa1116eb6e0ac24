"""Usage in backend responses: OpenAI JSON, OpenAI SSE usage chunks, SGLang ``meta_info``.

Pure functions over bytes. :func:`split_events` cuts a byte stream into complete SSE events
and a tail; :func:`usage_of` reads token counts from one decoded JSON object.
"""

from __future__ import annotations

import json

from filters.api import Usage
from wire.contract import SETTLE_KEY
from wire.jsontypes import JsonValue

__all__ = [
    "SETTLE_KEY",
    "count_events",
    "event_json",
    "is_usage_only_event",
    "split_events",
    "usage_from_json",
    "usage_of",
]


def count_events(chunk: bytes) -> int:
    """How many ``data:`` events (``[DONE]`` aside) a chunk of an SSE stream carries."""
    n = chunk.count(b"data:")
    return n - chunk.count(b"[DONE]") if n else 0


def split_events(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its blank-line terminator) and the incomplete tail."""
    data = data.replace(b"\r\n", b"\n")
    end = data.rfind(b"\n\n")
    if end < 0:
        return [], data
    body, tail = data[: end + 2], data[end + 2 :]
    events = [e + b"\n\n" for e in body[:-2].split(b"\n\n")]
    return events, tail


def event_json(event: bytes) -> JsonValue:
    """The JSON in an event's ``data:`` lines, or None (``[DONE]``, comments, bad JSON)."""
    lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    payload = b"\n".join(lines)
    if payload.strip() == b"[DONE]":
        return None
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return None


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def usage_of(obj: object) -> Usage | None:
    """Token counts from an OpenAI ``usage`` object (an embeddings answer's included: no
    completion tokens) or an SGLang ``meta_info``."""
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    # an embeddings answer's usage has no completion_tokens: prompt_tokens and total_tokens
    if isinstance(u, dict) and ("completion_tokens" in u or "total_tokens" in u):
        details = u.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Usage(_int(u.get("prompt_tokens")), _int(u.get("completion_tokens")), _int(cached))
    m = obj.get("meta_info")
    if isinstance(m, dict) and "completion_tokens" in m:
        return Usage(
            _int(m.get("prompt_tokens")), _int(m.get("completion_tokens")),
            _int(m.get("cached_tokens")),
        )  # fmt: skip
    return None


def usage_from_json(body: bytes) -> Usage | None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, list) and len(obj) == 1:  # /generate with a one-element batch
        obj = obj[0]
    return usage_of(obj)


def is_usage_only_event(obj: object) -> bool:
    """The extra chunk ``include_usage`` adds: usage set, ``choices`` empty."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("usage"), dict)
        and obj.get("choices") in ([], None)
    )
