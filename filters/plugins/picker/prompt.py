"""The prompt as the backend sees it, and its checkpoints (the picker's cheap fingerprint).

``prompt_bytes`` renders the request the way the backend does (the emulator's chat template, or
the model's own with ``routing.tokenizer``; ``/generate`` ``text``; ``/v1/completions``
``prompt``) and returns UTF-8 bytes, or None when the picker cannot
know the backend's prompt (token-id prompts, malformed bodies): such requests fall back to ring
hash.

``checkpoints`` cuts those bytes every ``step`` bytes, then farther apart in bands past the first
64 cuts (:mod:`filters.plugins.picker.cuts`), and returns one digest per whole chunk, each
naming the *whole prefix* up to its end (one incremental SHA-256, a copy per checkpoint). This is
the only per-request hashing on the request path: it runs at C speed over the buffer (SHA-256,
about 0.6 ms for 300 KB on the 2-core box, bench/routing_hash.py), whatever the page size. Two prompts
sharing their first ``cut_end(k)`` bytes share their first ``k`` checkpoints; a trailing partial
chunk is not fingerprinted, so matches are known at checkpoint granularity (an approximation: up
to one checkpoint of a shared prefix, ``step`` bytes or 1/32 of it, is not counted).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from chat.tokenizer import ChatTemplateError, HfChatTokenizer
from filters.plugins.picker.cuts import cuts
from filters.plugins.picker.mapper import ROOT, Point

__all__ = ["Hold", "Prompt", "checkpoints", "prompt_bytes", "render_emulator_chat"]

_ROLES = ("system", "user", "assistant", "tool", "developer")
_SALT_BYTES = 16  # the salt is padded to this: a salted and an unsalted prompt never collide
_DIGEST_BYTES = 16  # a checkpoint's digest (SHA-256, truncated)


@dataclass(slots=True)
class Hold:
    """Until when a pick's prefix counts as pending on its replica: one object shared by every
    checkpoint the pick wrote, so that the mapper's end shortens them all at once."""

    until: float


@dataclass(slots=True)
class Prompt:
    """One request's prompt as the picker saw it: its bytes, checkpoints and known points."""

    data: bytes
    marks: list[bytes]
    points: list[Point]
    root: Point = ROOT  # the point before its first token: the adapter's seed (mapper.adapter_root)
    holds: list[Hold] = field(default_factory=list)  # its picks' pending holds (PoolPicker)


def _content(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None
            text = part.get("text")
            if not isinstance(text, str):
                return None
            parts.append(text)
        return " ".join(parts)
    return None


def render_emulator_chat(messages: object) -> str | None:
    """The emulator's chat template (backends/emulator/tokenizer.py), or None if malformed."""
    if not isinstance(messages, list) or not messages:
        return None
    pieces: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            return None
        content = _content(msg.get("content"))
        if content is None:
            return None
        pieces.append(f"<|{msg['role']}|> {content} <|end|>")
    pieces.append("<|assistant|>")
    return " ".join(pieces)


def prompt_bytes(
    kind: str, data: Mapping[str, object], model: HfChatTokenizer | None = None
) -> bytes | None:
    """The rendered prompt of a parsed request body, or None when it cannot be known. With a
    ``model`` (``routing.tokenizer``): a chat request through its chat template as SGLang renders
    it, a plain prompt after the special tokens its tokenizer puts first; None when the template
    refuses the request."""
    text: object
    if kind == "chat":
        if model is None:
            text = render_emulator_chat(data.get("messages"))
        else:
            try:
                text = model.render_request(data)
            except ChatTemplateError:
                return None
    else:
        key = {"generate": "text", "embedding": "input"}.get(kind, "prompt")
        text = data.get(key)
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if isinstance(text, str) and model is not None:
            text = model.plain_prompt(text)
    if not isinstance(text, str):
        return None
    return text.encode("utf-8", "surrogatepass")


def checkpoints(data: bytes, step: int, salt: bytes = b"") -> list[bytes]:
    """One 16-byte digest per whole checkpoint, each over ``data[: cut_end(i + 1, step)]``
    (:mod:`filters.plugins.picker.cuts`: ``step`` bytes apart, then farther in bands); ``salt`` (at most 16 bytes: a LoRA adapter's seed) makes the same text under another adapter
    other checkpoints, as the backend caches it apart.

    SHA-256 (OpenSSL's, in the CPU's SHA instructions where it has them) over the salt padded to
    16 bytes, then the prompt; each digest truncated to 16 bytes. It hashes a long prompt 2-3x
    as fast as BLAKE2b did on the 2-core box (docs/benchmarks.md), and the prompt's bytes are
    most of this function's time. Slices of ``data`` are copied rather than viewed: a fresh
    ``bytes`` of one chunk costs less than a memoryview slice handed to OpenSSL."""
    if step <= 0:
        raise ValueError("step must be > 0")
    if len(salt) > _SALT_BYTES:
        raise ValueError(f"salt is at most {_SALT_BYTES} bytes, got {len(salt)}")
    hasher = hashlib.sha256(salt.ljust(_SALT_BYTES, b"\0"))
    update, copy = hasher.update, hasher.copy
    out: list[bytes] = []
    add = out.append
    for start, end in cuts(len(data), step):
        update(data[start:end])
        add(copy().digest()[:_DIGEST_BYTES])
    return out
