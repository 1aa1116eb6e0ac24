"""Prompt token counts for reservations: exact with a real tokenizer, else a bound from the bytes.

A reservation must never be lowered by the client, so what :func:`load_estimator` returns is
exact (:class:`TokenizerEstimator`, a ``tokenizer.json``, for texts up to 16 KiB characters:
:class:`ExactUpTo`) or an upper bound no layout of the text can beat (:class:`ByteBound`: a
byte-level BPE never yields more tokens than bytes). Long prompts used to be counted on 64 sampled windows and scaled: a
prompt crafted to look cheap in those windows was charged ~25 tokens for ~24,000 real ones
(issue 36). Nothing here samples any more.

:class:`HeuristicEstimator` splits text the way byte-level BPE pre-tokenizers do (letter runs,
digit runs, punctuation, whitespace, other characters) and charges each piece what BPE
vocabularies of ~100k entries typically charge; its coefficients were fitted on real English
prose, code and JSON (``bench/filters_estimate.py``). It is a typical count, not a bound (spaced
symbols, CJK, emoji and long digit runs cost more with real vocabularies), so it only measures
and cuts prefixes for routing; it no longer sizes reservations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from filters.errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "ByteBound",
    "Estimator",
    "ExactUpTo",
    "HeuristicEstimator",
    "Pieces",
    "TokenizerEstimator",
    "load_estimator",
    "pieces",
]


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

# The same counts from byte tables over the UTF-8 text, with no list per word: bytes.translate
# maps each byte to 0 or 1, and the runs are counted with shifts and ANDs of that mask read as
# one big integer (``int.bit_count``), all in C. Six regex scans that built a list of every
# match took 2 ms for a 15 KB prompt; lists of run lengths (one per word) still took a fifth of
# the filter server's CPU on 3 KB prompts. Bytes >= 0x80 are never letters, digits or ASCII
# space, as in the expressions above.
_LETTER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_DIGIT_BYTES = frozenset(b"0123456789")
_LETTER_BITS = bytes(1 if i in _LETTER_BYTES else 0 for i in range(256))
_DIGIT_BITS = bytes(1 if i in _DIGIT_BYTES else 0 for i in range(256))
_ONLY_DIGITS = bytes(i if i in _DIGIT_BYTES else 0x20 for i in range(256))
_ASCII_SPACE = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "  # what \s matches below 0x80
_ASCII = bytes(range(0x80))
# what \s matches above 0x7f (str.isspace)
_WIDE_SPACE = frozenset(
    "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_LONG = 7  # _LONG_WORD's shortest run


def _widen(mask: int, have: int, width: int) -> int:
    """``mask`` (bit 8i set where byte i ends a run of ``have`` set bytes) for runs of
    ``width`` set bytes or more: doubling shifts, O(log width) big-integer operations."""
    while have < width and mask:
        step = min(have, width - have)
        mask &= mask << (8 * step)
        have += step
    return mask


_MASK_LEVELS = 8  # digit runs up to 8 * digits_per_token by masks, else from a list of runs


def _digit_tokens(b: bytes, k: int) -> tuple[int, int]:
    """Digits, and the sum over digit runs of ``ceil(len / k)``: how many of the widths
    1, k + 1, 2k + 1, ... each run reaches (runs of at least w: positions ending a w-window,
    less those whose neighbour ends one too), so a few mask operations per width; a text with
    a run past the last width falls back to a list of run lengths (the cost stays linear)."""
    window = int.from_bytes(b.translate(_DIGIT_BITS), "little")
    n_digits = window.bit_count()
    tokens, width = 0, 1
    for _ in range(_MASK_LEVELS):
        if not window:
            return n_digits, tokens
        longer = window & (window << 8)
        tokens += window.bit_count() - longer.bit_count()
        window = _widen(longer, width + 1, width + k)
        width += k
    if not window:
        return n_digits, tokens
    return n_digits, sum(-(-n // k) for n in map(len, b.translate(_ONLY_DIGITS).split()))


def _newline_runs(b: bytes) -> int:
    """Runs of ``\\n``: newlines less those right after another (the empty lines between two
    newlines), counted by ``bytes.count`` and ``split`` in C."""
    n = b.count(b"\n")
    if n < 2 or b"\n\n" not in b:
        return n
    lines = b.split(b"\n")
    return n - (lines.count(b"") - b.startswith(b"\n") - b.endswith(b"\n"))


@dataclass(frozen=True, slots=True)
class Pieces:
    """What the regular expressions above find in a text, counted."""

    words: int  # letter runs (_WORD)
    letters: int  # letters in them
    long_runs: int  # runs of 7 letters or more (_LONG_WORD)
    long_letters: int  # letters in those runs past the sixth
    digits: int  # digits (in _DIGITS's runs)
    digit_tokens: int  # the sum over digit runs of ceil(len / per_token)
    symbols: int  # neither space, ASCII letter nor digit (_SYMBOL)
    wide: int  # non-ASCII characters (_NON_ASCII)
    newlines: int  # newline runs (_NEWLINES)


def pieces(text: str, digits_per_token: int = 3) -> Pieces:
    """The counts of :class:`Pieces`, from byte tables and big-integer masks (no list of
    matches, no list of run lengths)."""
    b = text.encode("utf-8", "surrogatepass")
    # bit 8i of a mask: byte i ends a run of (at least) that many letters
    one = int.from_bytes(b.translate(_LETTER_BITS), "little")
    two = one & (one << 8)
    seven = _widen(two, 2, _LONG)
    eight = seven & (seven << 8)
    n_letters = one.bit_count()
    n_seven = seven.bit_count()
    n_digits, digit_tokens = _digit_tokens(b, digits_per_token)
    space = len(b) - len(b.translate(None, _ASCII_SPACE))
    wide = 0
    if not text.isascii():
        # the non-ASCII characters alone: deleting ASCII bytes leaves whole UTF-8 sequences
        others = b.translate(None, _ASCII).decode("utf-8", "surrogatepass")
        wide = len(others)
        space += sum(others.count(c) for c in _WIDE_SPACE.intersection(others))
    return Pieces(
        words=n_letters - two.bit_count(),
        letters=n_letters,
        long_runs=n_seven - eight.bit_count(),
        long_letters=n_seven,
        digits=n_digits,
        digit_tokens=digit_tokens,
        symbols=len(text) - n_letters - n_digits - space,
        wide=wide,
        newlines=_newline_runs(b),
    )


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
        return max(1, round(self.tokens(text))) if text else 0

    def tokens(self, text: str) -> float:
        """The unrounded estimate; additive over texts joined by a space (a space costs
        nothing and splits no piece)."""
        p = pieces(text, self.digits_per_token)
        # letters past word_free_chars in runs of 7 or more (_LONG_WORD): each such run has
        # 6 letters not counted in long_letters
        long_extra = p.long_letters + (_LONG - 1 - self.word_free_chars) * p.long_runs
        total = p.words * self.word_tokens
        total += long_extra / self.word_chars
        total += p.digit_tokens * self.digit_weight
        total += p.symbols * self.symbol_tokens
        if p.wide:
            total += p.wide * (self.non_ascii_tokens - self.symbol_tokens)
        total += p.newlines * self.newline_tokens
        return total

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
            self._tok: Tokenizer = Tokenizer.from_file(str(path))
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
class ByteBound:
    """An upper bound on any byte-level BPE's count: the text's UTF-8 bytes.

    A byte-level BPE starts from one token per byte and only ever merges, so no such tokenizer
    (GPT-2, Llama 3, Qwen, DeepSeek families) produces more tokens than bytes, whatever the
    vocabulary and however the text is laid out: a client cannot lower this bound by crafting
    its prompt. It over-counts English prose about 4x and CJK about 2-3x (bench/
    filters_estimate.py); a filter server given the model's ``tokenizer.json`` (``--tokenizer``)
    counts texts up to 16 KiB characters exactly instead (:class:`ExactUpTo`). O(1) for ASCII text (CPython knows a string is ASCII), one
    ``encode`` otherwise. ``prefix_chars`` is the heuristic's (a cut of 4 characters per token:
    it decides what is hashed for routing, not what is charged)."""

    cut: HeuristicEstimator = HeuristicEstimator()

    def count(self, text: str) -> int:
        if text.isascii():
            return len(text)
        return len(text.encode("utf-8", "surrogatepass"))

    def prefix_chars(self, text: str, tokens: int) -> int:
        return self.cut.prefix_chars(text, tokens)


@dataclass(frozen=True, slots=True)
class ExactUpTo:
    """``exact``'s count for texts up to ``up_to`` characters, :class:`ByteBound` beyond: both
    are at least the real count, and a tokenizer costs about a microsecond per byte (a 300 KB
    prompt took 0.2-0.4 s with Llama 3's on this machine, bench/prompt_bound.py), the bytes
    nothing. ``prefix_chars`` is ``exact``'s."""

    exact: Estimator
    up_to: int = 16_384
    bound: ByteBound = ByteBound()

    def count(self, text: str) -> int:
        if len(text) <= self.up_to:
            return self.exact.count(text)
        return self.bound.count(text)

    def prefix_chars(self, text: str, tokens: int) -> int:
        return self.exact.prefix_chars(text, tokens)


def load_estimator(tokenizer_file: str | None) -> Estimator:
    """The tokenizer when a file is given (exact up to 16 KiB characters, the byte bound past
    that), else :class:`ByteBound`."""
    if tokenizer_file:
        return ExactUpTo(TokenizerEstimator(tokenizer_file))
    return ByteBound()
