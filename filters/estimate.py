"""Prompt token estimates: a real tokenizer file when configured, else a calibrated heuristic.

The heuristic splits text the way byte-level BPE pre-tokenizers do (letter runs, digit runs,
punctuation, whitespace, other characters) and charges each piece what BPE vocabularies of
~100k entries typically charge; its coefficients were fitted on real English prose, code and
JSON, and its error is measured by ``bench/filters_estimate.py`` (numbers in docs/plugins.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from filters.errors import ConfigError

__all__ = ["Estimator", "HeuristicEstimator", "TokenizerEstimator", "load_estimator"]


class Estimator(Protocol):
    def count(self, text: str) -> int:
        """Estimated number of tokens in ``text``."""
        ...

    def prefix_chars(self, text: str, tokens: int) -> int:
        """How many leading characters of ``text`` hold its first ``tokens`` tokens."""
        ...


# letter runs (with one leading space, as BPE merges it), digit runs, whitespace, one symbol
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+|\s+| ?[^\sA-Za-z0-9]")


@dataclass(frozen=True, slots=True)
class HeuristicEstimator:
    """Piecewise BPE cost model. ``word_chars``: letters a long word spends per token."""

    word_free_chars: int = 6
    word_chars: float = 3.2
    digits_per_token: int = 3
    newline_run_tokens: float = 1.0
    non_ascii_tokens: float = 1.0
    per_message: int = 3

    def _piece(self, piece: str) -> float:
        c = piece[-1]
        if c.isascii():
            if c.isalpha():
                n = len(piece) - (piece[0] == " ")
                extra = n - self.word_free_chars
                return 1.0 if extra <= 0 else 1.0 + extra / self.word_chars
            if c.isdigit():
                n = len(piece) - (piece[0] == " ")
                return float(-(-n // self.digits_per_token))
            if c.isspace():
                return self.newline_run_tokens if "\n" in piece or len(piece) > 1 else 0.0
            return 1.0
        if c.isspace():
            return 0.0
        return self.non_ascii_tokens

    def count(self, text: str) -> int:
        total = 0.0
        for m in _PIECE.finditer(text):
            total += self._piece(m.group())
        return max(1, round(total)) if text else 0

    def prefix_chars(self, text: str, tokens: int) -> int:
        total = 0.0
        for m in _PIECE.finditer(text):
            total += self._piece(m.group())
            if total >= tokens:
                return m.end()
        return len(text)


class TokenizerEstimator:
    """Exact counts from a Hugging Face ``tokenizer.json`` (needs the ``tokenizers`` extra)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError(
                "a tokenizer file is configured but 'tokenizers' is not installed "
                "(pip install 'tokenweir[tokenizer]')"
            ) from exc
        try:
            self._tok: Any = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception type
            raise ConfigError(f"cannot load tokenizer file {path}: {exc}") from exc
        self.path = str(path)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def prefix_chars(self, text: str, tokens: int) -> int:
        offsets = self._tok.encode(text, add_special_tokens=False).offsets
        if not offsets or tokens >= len(offsets):
            return len(text)
        return int(offsets[tokens - 1][1]) if tokens > 0 else 0


def load_estimator(tokenizer_file: str | None) -> Estimator:
    """The tokenizer when a file is given, else the heuristic."""
    if tokenizer_file:
        return TokenizerEstimator(tokenizer_file)
    return HeuristicEstimator()
