"""Prompt token estimates: a real tokenizer file when configured, else a calibrated heuristic.

The heuristic splits text the way byte-level BPE pre-tokenizers do (letter runs, digit runs,
punctuation, whitespace, other characters) and charges each piece what BPE vocabularies of
~100k entries typically charge; its coefficients were fitted on real English prose, code and
JSON, and its error is measured by ``bench/filters_estimate.py`` (numbers in docs/plugins.md).

Long prompts are counted on a sample (:class:`Sampled`, what :func:`load_estimator` returns): a
text longer than 16 KiB characters is counted in 64 evenly spaced windows of 256 characters, cut
at whitespace, and the count is scaled by the text's length over the windows' length, so the
cost per request is bounded (a 300 KB prompt took 5-11 ms to count whole on this machine, a
tokenizer far more) and the answer stays deterministic. An estimate only sizes the reservation
and the clamp; the backend's usage settles the real count.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from filters.errors import ConfigError

__all__ = ["Estimator", "HeuristicEstimator", "Sampled", "TokenizerEstimator", "load_estimator"]


class Estimator(Protocol):
    def count(self, text: str) -> int:
        """Estimated number of tokens in ``text``."""
        ...

    def prefix_chars(self, text: str, tokens: int) -> int:
        """How many leading characters of ``text`` hold its first ``tokens`` tokens."""
        ...


# The pieces, as regular expressions (what the counts mean; bench/filters_estimate.py fits on
# them and tests/filters/test_estimate.py checks :func:`pieces` against them).
_LONG_WORD = re.compile(r"[A-Za-z]{7,}")
_DIGITS = re.compile(r"[0-9]+")
_WORD = re.compile(r"[A-Za-z]+")
_SYMBOL = re.compile(r"[^\sA-Za-z0-9]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_NEWLINES = re.compile(r"\n+")

# The same counts from byte tables over the UTF-8 text: bytes.translate and bytes.split run in
# C at memory speed, where six regex scans built a list of every match (2 ms for a 15 KB prompt,
# a third of the filter server's CPU on long conversations). Bytes >= 0x80 are never letters,
# digits or ASCII space, as in the expressions above.
_LETTER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_DIGIT_BYTES = frozenset(b"0123456789")
_ONLY_LETTERS = bytes(i if i in _LETTER_BYTES else 0x20 for i in range(256))
_ONLY_DIGITS = bytes(i if i in _DIGIT_BYTES else 0x20 for i in range(256))
_ONLY_NEWLINES = bytes(0x6E if i == 0x0A else 0x20 for i in range(256))
_ASCII_SPACE = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "  # what \s matches below 0x80
_NOT_LEAD = bytes(range(0xC0))  # deleted, what is left is one UTF-8 lead byte per character
# what \s matches above 0x7f (str.isspace)
_WIDE_SPACE = "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def pieces(text: str) -> tuple[list[int], list[int], int, int, int]:
    """Letter-run lengths, digit-run lengths, symbols (neither space, ASCII letter nor digit),
    non-ASCII characters and newline runs: what ``_WORD``, ``_DIGITS``, ``_SYMBOL``,
    ``_NON_ASCII`` and ``_NEWLINES`` find (the runs of 7 letters or more among the letter runs
    are ``_LONG_WORD``'s), without building a list of matches."""
    b = text.encode("utf-8", "surrogatepass")
    words = list(map(len, b.translate(_ONLY_LETTERS).split()))
    digits = list(map(len, b.translate(_ONLY_DIGITS).split()))
    space = len(b) - len(b.translate(None, _ASCII_SPACE))
    wide = 0
    if not text.isascii():
        wide = len(b.translate(None, _NOT_LEAD))
        space += sum(text.count(c) for c in _WIDE_SPACE)
    symbols = len(text) - sum(words) - sum(digits) - space
    return words, digits, symbols, wide, len(b.translate(_ONLY_NEWLINES).split())


_TABLE = 512  # runs up to this length are looked up; a longer one (rare) is computed


def _rule(kind: str, k: int) -> Callable[[int], int]:
    """Letters past ``k`` in a run of 7 or more ("long"), or ``ceil(n / k)`` tokens per digit
    run ("digits")."""
    if kind == "long":
        return lambda n: n - k if n >= 7 else 0
    return lambda n: -(-n // k)


@functools.lru_cache(maxsize=16)
def _table(kind: str, k: int) -> tuple[int, ...]:
    return tuple(map(_rule(kind, k), range(_TABLE)))


def _summed(kind: str, k: int, lengths: list[int]) -> int:
    """``kind``'s rule summed over ``lengths``: looked up in C, computed past the table."""
    if lengths and max(lengths) >= _TABLE:
        return sum(map(_rule(kind, k), lengths))
    return sum(map(_table(kind, k).__getitem__, lengths))


@dataclass(frozen=True, slots=True)
class HeuristicEstimator:
    """Piecewise BPE cost model, computed from byte tables (:func:`pieces`; no regex scan).

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
        words, digits, symbols, wide, newlines = pieces(text)
        # letters past word_free_chars in runs of 7 or more (_LONG_WORD), and each digit run's
        # tokens, by table lookups in C (a generator per run was a fifth of the estimate)
        long_extra = _summed("long", self.word_free_chars, words)
        total = len(words) * self.word_tokens
        total += long_extra / self.word_chars
        total += _summed("digits", self.digits_per_token, digits) * self.digit_weight
        total += symbols * self.symbol_tokens
        if wide:
            total += wide * (self.non_ascii_tokens - self.symbol_tokens)
        total += newlines * self.newline_tokens
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


@dataclass(frozen=True, slots=True)
class Sampled:
    """``inner``'s count, taken on a sample of texts longer than ``exact_up_to`` characters:
    ``windows`` evenly spaced windows of about ``window_chars`` (each end moved to the next
    whitespace, within ``window_chars``, so no word is cut), scaled by length; at most
    ``windows × 2 × window_chars`` characters are counted. ``prefix_chars`` is ``inner``'s."""

    inner: Estimator
    exact_up_to: int = 16_384
    windows: int = 64  # many small windows: a long prompt mixes prose, code, tables
    window_chars: int = 256

    def count(self, text: str) -> int:
        n = len(text)
        if n <= self.exact_up_to:
            return self.inner.count(text)
        step = n / self.windows
        reach = self.window_chars  # how far a cut may move to reach whitespace
        counted = chars = 0
        for i in range(self.windows):
            start = _cut(text, int(i * step), reach)
            end = _cut(text, min(n, start + self.window_chars), reach)
            if end > start:
                counted += self.inner.count(text[start:end])
                chars += end - start
        return max(1, round(counted * n / chars)) if chars else self.inner.count(text)

    def prefix_chars(self, text: str, tokens: int) -> int:
        return self.inner.prefix_chars(text, tokens)


_FIND_SPACE = re.compile(r"\s")


def _cut(text: str, i: int, reach: int) -> int:
    """Where to cut ``text`` near ``i``: ``i`` itself between two pieces, else the first
    whitespace within ``reach`` characters after it (a word is not split), else ``i`` (text
    without whitespace: a cut word costs at most one piece)."""
    n = len(text)
    if i <= 0 or i >= n or text[i - 1].isspace() or text[i].isspace():
        return min(max(i, 0), n)
    m = _FIND_SPACE.search(text, i, min(n, i + reach))
    return m.start() if m is not None else i


def load_estimator(tokenizer_file: str | None) -> Estimator:
    """The tokenizer when a file is given, else the heuristic; long texts counted on a sample."""
    if tokenizer_file:
        return Sampled(TokenizerEstimator(tokenizer_file))
    return Sampled(HeuristicEstimator())
