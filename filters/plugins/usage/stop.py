"""The in-stream stop, pure part: count the completion tokens an SSE stream serves, find where
the tokens a budget allows end inside a chunk, and write the events that end a stream cleanly.

Counting (docs/quotas.md, "The in-stream stop"). OpenAI streams (``/v1/chat/completions``,
``/v1/completions``): one token per event (SGLang sends one decode step per event at its
default ``--stream-interval 1``, the emulator one word). The quick count of a chunk is its event
starts (``data:`` at the start of a line); it over-counts the events that carry no token (the
role event, the finish event, the usage event, ``[DONE]`` aside), which only ever stops a stream
early, never late. Only when the quick count would pass the allowance are the chunk's events
read one by one (:func:`cut`), counting a token only for an event that carries text. SGLang's
``/generate`` stream carries the running ``meta_info.completion_tokens`` in every event
(cumulative text, possibly several tokens per event): that number is the count.

Stopping (:func:`stop_events`): OpenAI streams get a last chunk with ``finish_reason:
"length"``, the usage chunk when the client asked for ``include_usage``, and ``data: [DONE]``;
``/generate`` gets its last kept event again with ``finish_reason`` ``{"type": "length"}`` and
the served count, then ``[DONE]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from filters.sse import event_json
from wire.jsontypes import JsonObject, JsonValue

__all__ = [
    "DONE",
    "Cut",
    "cut",
    "event_starts",
    "generate_count",
    "quick_count",
    "stop_events",
    "stream_head",
]

DONE = b"data: [DONE]\n\n"
_START = re.compile(rb"(?:^|\n)data:")
_GEN_COUNT = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def event_starts(chunk: bytes, at_line_start: bool = True) -> list[int]:
    """Byte offsets where an event's ``data:`` line starts (``at_line_start``: the chunk begins
    a line, i.e. the previous chunk ended with a newline)."""
    out = [m.start() + (1 if chunk[m.start() : m.start() + 1] == b"\n" else 0)
           for m in _START.finditer(chunk)]  # fmt: skip
    if out and out[0] == 0 and not at_line_start:
        out.pop(0)
    return out


def quick_count(chunk: bytes) -> int:
    """An upper bound of the tokens a chunk of an OpenAI stream carries: its event starts
    (``[DONE]`` aside). A bound for a chunk that begins a line; otherwise one more at most."""
    n = chunk.count(b"\ndata:") + (1 if chunk.startswith(b"data:") else 0)
    return n - chunk.count(b"data: [DONE]") if n else 0


def generate_count(chunk: bytes) -> int | None:
    """The last ``completion_tokens`` a chunk of a ``/generate`` stream reports, or None."""
    last = None
    for m in _GEN_COUNT.finditer(chunk):
        last = m
    return int(last.group(1)) if last is not None else None


def _carries_text(obj: object) -> bool:
    if not isinstance(obj, dict):
        return False
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")
                                        or delta.get("tool_calls")):  # fmt: skip
            return True
        if choice.get("text"):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Cut:
    """``keep``: bytes of the chunk to pass (whole events); ``tokens``: what they carry;
    ``stopped``: an event that carries a token was left out (the allowance is spent);
    ``last``: the last kept event that parsed (for ``/generate``'s closing event)."""

    keep: int
    tokens: int
    stopped: bool
    last: JsonValue = None


def cut(
    chunk: bytes, allowance: int, *, generate: bool, at_line_start: bool = True, served: int = 0
) -> Cut:
    """Where ``chunk`` must end so that its events serve at most ``allowance`` tokens.

    OpenAI streams: an event counts 1 when it carries text, else 0 (an event still incomplete
    at the chunk's end counts 1: it cannot be read yet). ``/generate``: an event's count is its
    ``completion_tokens`` (cumulative, ``served`` before this chunk); ``allowance`` is then the
    cumulative bound and ``Cut.tokens`` the cumulative count kept."""
    starts = event_starts(chunk, at_line_start)
    tokens = served if generate else 0
    last: JsonValue = None
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(chunk)
        raw = chunk[s:end]
        if raw.startswith(b"data: [DONE]"):
            continue
        obj = event_json(raw) if raw.endswith(b"\n\n") else None
        if generate:
            meta = obj.get("meta_info") if isinstance(obj, dict) else None
            count = meta.get("completion_tokens") if isinstance(meta, dict) else None
            n = count if isinstance(count, int) else tokens + 1
            if n > allowance:
                return Cut(s, tokens, True, last)
            tokens = n
        else:
            n = 1 if obj is None or _carries_text(obj) else 0
            if tokens + n > allowance:
                return Cut(s, tokens, True, last)
            tokens += n
        if obj is not None:
            last = obj
    return Cut(len(chunk), tokens, False, last)


def stream_head(chunk: bytes) -> JsonObject | None:
    """The first event of a stream, parsed (its id is the backend's rid; model and created
    are copied into the closing chunks), or None."""
    starts = event_starts(chunk)
    if not starts:
        return None
    end = chunk.find(b"\n\n", starts[0])
    if end < 0:
        return None
    obj = event_json(chunk[starts[0] : end + 2])
    return obj if isinstance(obj, dict) else None


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def stop_events(
    kind: str,
    head: Mapping[str, object] | None,
    prompt: int,
    completion: int,
    *,
    with_usage: bool,
    last: JsonValue = None,
) -> bytes:
    """The events that end a stream at its budget (``kind``: chat, completion or generate)."""
    if kind == "generate":
        obj: JsonObject = dict(last) if isinstance(last, dict) else {"text": ""}
        found = obj.get("meta_info")
        meta: JsonObject = dict(found) if isinstance(found, dict) else {}
        meta["finish_reason"] = {"type": "length", "length": completion}
        meta["completion_tokens"] = completion
        meta.setdefault("prompt_tokens", prompt)
        obj["meta_info"] = meta
        return _sse(obj) + DONE
    h: Mapping[str, object] = head or {}
    env = {
        "id": h.get("id", ""),
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": h.get("created", 0),
        "model": h.get("model", ""),
    }
    if kind == "chat":
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    else:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    out = _sse({**env, "choices": [choice]})
    if with_usage:
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        out += _sse({**env, "choices": [], "usage": usage})
    return out + DONE
