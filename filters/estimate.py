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


_LONG_WORD = re.compile(r"[A-Za-z]{7,}")
_DIGITS = re.compile(r"[0-9]+")
_WORD = re.compile(r"[A-Za-z]+")
_SYMBOL = re.compile(r"[^\sA-Za-z0-9]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_NEWLINES = re.compile(r"\n+")


@dataclass(frozen=True, slots=True)
class HeuristicEstimator:
    """Piecewise BPE cost model, computed with a few regex scans (no per-piece Python loop).

    Each letter run costs ``word_tokens``, plus ``1/word_chars`` per letter beyond
    ``word_free_chars``; each digit run ``digit_weight * ceil(len / digits_per_token)``; each
    ASCII symbol ``symbol_tokens``; each non-ASCII character ``non_ascii_tokens``; each run of
    newlines ``newline_tokens``. The defaults are a least-squares fit on prose, code and JSON
    (bench/filters_estimate.py); non-ASCII text was too rare there to fit, so it stays at 1.
    ``prefix_chars`` uses a fixed ``chars_per_token`` so a prefix's cut depends on nothing after
    it (the turns of one conversation must hash alike).
    """

    word_tokens: float = 1.05
    word_free_chars: int = 6
    word_chars: float = 6.4
    digits_per_token: int = 3
    digit_weight: float = 1.5
    symbol_tokens: float = 0.73
    non_ascii_tokens: float = 1.0
    newline_tokens: float = 0.62
    chars_per_token: float = 4.0

    def count(self, text: str) -> int:
        if not text:
            return 0
        free = self.word_free_chars
        total = len(_WORD.findall(text)) * self.word_tokens
        long_extra = sum(len(w) - free for w in _LONG_WORD.findall(text))
        total += long_extra / self.word_chars
        d = self.digits_per_token
        total += sum(-(-len(r) // d) for r in _DIGITS.findall(text)) * self.digit_weight
        total += len(_SYMBOL.findall(text)) * self.symbol_tokens
        if not text.isascii():
            total += len(_NON_ASCII.findall(text)) * (self.non_ascii_tokens - self.symbol_tokens)
        total += len(_NEWLINES.findall(text)) * self.newline_tokens
        return max(1, round(total))

    def prefix_chars(self, text: str, tokens: int) -> int:
        return min(len(text), int(tokens * self.chars_per_token))


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
