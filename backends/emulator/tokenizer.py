"""The emulator's deterministic tokenizer, chat template and output text.

Tokenizer: one token per whitespace-separated word; a token's id is ``zlib.crc32`` of the word's
UTF-8 bytes (stable across processes and Python versions, unlike ``hash``). Decoding is not
needed: the emulator only decodes words it produced itself, and it keeps them.

Chat template (documented so prefix caching is meaningful)::

    <|system|> {content} <|end|> <|user|> {content} <|end|> ... <|assistant|>

Each message becomes ``<|role|>``, its words, ``<|end|>``; the prompt ends with ``<|assistant|>``.
The answer's words follow, so the rendered prompt of turn N+1 (which carries the answer as an
assistant message) starts with the token ids of turn N's prompt plus answer.

Output text: words drawn from a fixed, generated vocabulary by a ``random.Random`` seeded from the
server seed and the prompt, so the same prompt gives the same answer (as temperature 0 would).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from backends.errors import RequestError

__all__ = [
    "OutputWords",
    "encode",
    "prompt_seed",
    "render_chat",
    "token_id",
    "trace_block_text",
    "vocabulary",
]

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "fi", "gu", "ha")


def token_id(word: str) -> int:
    """The id of one word."""
    return zlib.crc32(word.encode())


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one per whitespace-separated word."""
    return [zlib.crc32(w.encode()) for w in text.split()]


def _content_text(content: object, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(
                    f"messages[{index}].content: only text parts are supported", "messages"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError(f"messages[{index}].content: text must be a string", "messages")
            parts.append(text)
        return " ".join(parts)
    raise RequestError(f"messages[{index}].content must be a string or a list", "messages")


def render_chat(messages: object) -> str:
    """Render OpenAI chat messages with the template above (RequestError when malformed)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    pieces: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestError(f"messages[{i}] must be an object", "messages")
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise RequestError(f"messages[{i}].role {role!r} is not a valid role", "messages")
        pieces.append(f"<|{role}|> {_content_text(msg.get('content'), i)} <|end|>")
    pieces.append("<|assistant|>")
    return " ".join(pieces)


def prompt_seed(server_seed: int, prompt_ids: Sequence[int]) -> int:
    """A seed for one answer: the server seed mixed with a digest of the whole prompt."""
    digest = zlib.crc32(len(prompt_ids).to_bytes(8, "little"))
    for tid in prompt_ids[-64:]:
        digest = zlib.crc32(tid.to_bytes(4, "little"), digest)
    digest = zlib.crc32(b"".join(t.to_bytes(4, "little") for t in prompt_ids[:64]), digest)
    return (server_seed * 0x9E3779B1 + digest) & 0xFFFFFFFFFFFF


def vocabulary(size: int = 1024) -> tuple[str, ...]:
    """A fixed vocabulary of pronounceable words (deterministic, no randomness)."""
    n = len(_SYLLABLES)
    words: list[str] = []
    i = 0
    while len(words) < size:
        a, b, c = i % n, (i // n) % n, (i // (n * n)) % n
        words.append(_SYLLABLES[a] + _SYLLABLES[b] + _SYLLABLES[c])
        i += 1
    return tuple(words)


@dataclass(frozen=True, slots=True)
class OutputWords:
    """The vocabulary answers are drawn from, with precomputed token ids."""

    words: tuple[str, ...]
    ids: tuple[int, ...]

    @classmethod
    def build(cls, size: int = 1024) -> OutputWords:
        words = vocabulary(size)
        return cls(words=words, ids=tuple(token_id(w) for w in words))

    def rng_for(self, server_seed: int, prompt_ids: Sequence[int]) -> random.Random:
        return random.Random(prompt_seed(server_seed, prompt_ids))


def trace_block_text(block_id: int, tokens: int) -> str:
    """Text of one prefix block of a trace: ``tokens`` words unique to ``block_id``.

    Equal ids give equal text; different ids differ at their first word, so the token-level
    prefix structure of a trace's ``hash_ids`` is kept exactly.
    """
    return " ".join(f"b{block_id}w{i}" for i in range(tokens))
