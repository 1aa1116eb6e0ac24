from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.errors import ConfigError
from filters.estimate import (
    ByteBound,
    ExactUpTo,
    HeuristicEstimator,
    TokenizerEstimator,
    load_estimator,
)


def test_heuristic_counts_grow_with_text_and_handle_edges() -> None:
    h = HeuristicEstimator()
    assert h.count("") == 0
    assert h.count("hi") == 1
    short = h.count("The weir keeps the river steady.")
    assert 6 <= short <= 10
    assert h.count("The weir keeps the river steady. " * 10) > 9 * short
    assert h.count("1234567890") >= 4  # digit runs split in threes
    assert h.count("internationalization") > h.count("nation")
    assert h.count("日本語のテキスト") >= 8  # one per non-ASCII character


def test_heuristic_prefix_cut_depends_only_on_the_prefix() -> None:
    h = HeuristicEstimator()
    a = "x" * 5000
    assert h.prefix_chars(a, 256) == h.prefix_chars(a + "different tail", 256) == 1024
    assert h.prefix_chars("short", 256) == 5


def test_tokenizer_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "weir": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    exact = load_estimator(str(path))  # exact up to 16 KiB characters, the bytes past that
    assert isinstance(exact, ExactUpTo)
    est = exact.exact
    assert isinstance(est, TokenizerEstimator)
    assert exact.count("hello world weir river") == 4
    assert exact.count("hello world " * 1_000) == 2_000  # 12,000 characters: counted
    assert exact.count("hello world " * 20_000) == 240_000  # past 16 KiB: its bytes
    assert est.prefix_chars("hello world weir", 2) == len("hello world")
    assert est.prefix_chars("hello", 5) == 5
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError):
        TokenizerEstimator(bad)


def _regex_count(h: HeuristicEstimator, text: str) -> int:
    """The estimator as it was first written: six regex scans (the oracle for :func:`pieces`)."""
    from filters.estimate import _DIGITS, _LONG_WORD, _NEWLINES, _NON_ASCII, _SYMBOL, _WORD

    if not text:
        return 0
    total = len(_WORD.findall(text)) * h.word_tokens
    total += sum(len(w) - h.word_free_chars for w in _LONG_WORD.findall(text)) / h.word_chars
    d = h.digits_per_token
    total += sum(-(-len(r) // d) for r in _DIGITS.findall(text)) * h.digit_weight
    total += len(_SYMBOL.findall(text)) * h.symbol_tokens
    if not text.isascii():
        total += len(_NON_ASCII.findall(text)) * (h.non_ascii_tokens - h.symbol_tokens)
    total += len(_NEWLINES.findall(text)) * h.newline_tokens
    return max(1, round(total))


_TRICKY = "aZ09 \t\n\r\x0b\x0c\x1c\x1f\x7f\x80\x85\xa0é日\u2003\u3000\U0001f600\ud800.,{}\"'"


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(_TRICKY), max_size=200) | st.text(max_size=200),
    st.integers(1, 5),
)
def test_the_byte_table_counts_equal_the_regex_counts(text: str, per_token: int) -> None:
    """Letter, digit, space and newline runs from byte tables and big-integer masks over the
    UTF-8 text count exactly what the regular expressions find, for any text (non-ASCII spaces,
    lone surrogates)."""
    from filters.estimate import (
        _DIGITS,
        _LONG_WORD,
        _NEWLINES,
        _NON_ASCII,
        _SYMBOL,
        _WORD,
        pieces,
    )

    p = pieces(text, per_token)
    words = [len(w) for w in _WORD.findall(text)]
    long_ = [len(w) for w in _LONG_WORD.findall(text)]
    runs = [len(r) for r in _DIGITS.findall(text)]
    assert (p.words, p.letters) == (len(words), sum(words))
    assert (p.long_runs, p.long_letters) == (len(long_), sum(n - 6 for n in long_))
    assert (p.digits, p.digit_tokens) == (sum(runs), sum(-(-n // per_token) for n in runs))
    assert p.symbols == len(_SYMBOL.findall(text))
    assert p.wide == len(_NON_ASCII.findall(text))
    assert p.newlines == len(_NEWLINES.findall(text))
    for h in (
        HeuristicEstimator(),
        HeuristicEstimator(word_free_chars=4, digits_per_token=2),
        HeuristicEstimator(word_free_chars=8),
    ):
        assert h.count(text) == _regex_count(h, text)


def test_the_wide_spaces_are_what_the_regex_engine_calls_space() -> None:
    import re

    from filters.estimate import _WIDE_SPACE

    assert {c for c in map(chr, range(0x80, 0x110000)) if re.match(r"\s", c)} == _WIDE_SPACE


@pytest.mark.parametrize(
    "h", [HeuristicEstimator(), HeuristicEstimator(word_free_chars=4, digits_per_token=2)]
)
def test_long_runs_count_as_the_regexes_do(h: HeuristicEstimator) -> None:
    text = "a" * 600 + " 12 " + "7" * 700 + " word " + "b" * 511 + " " + "9" * 512 + " tiny"
    assert h.count(text) == _regex_count(h, text)


ROOT = Path(__file__).resolve().parents[2]


def _corpus(kind: str, size: int) -> str:
    """Real text of the repository, frozen in tests/data so that editing a doc, a filter or a
    benchmark result does not move the test: prose (the docs as of 013f7a5), Python source
    (``filters/**/*.py``) and JSON (``bench/results/*.json``) as of this session's main."""
    text = (ROOT / "tests" / "data" / f"estimate_{kind}.txt").read_text()
    assert len(text) >= size, (kind, len(text))
    return text[:size]


@pytest.mark.parametrize("kind", ["prose", "code", "json"])
def test_real_text_counts_as_the_regexes_do(kind: str) -> None:
    h = HeuristicEstimator()
    text = _corpus(kind, 71_000)
    assert h.count(text) == _regex_count(h, text)


def test_load_estimator_bounds_from_the_bytes_without_a_tokenizer() -> None:
    est = load_estimator(None)
    assert isinstance(est, ByteBound)
    assert est.count("") == 0 and est.count("abc") == 3 and est.count("日本") == 6
    assert est.count("\U0001f600") == 4 and est.count("\ud800") == 3  # a lone surrogate too
    assert est.prefix_chars("abcdefgh", 1) == 4  # the prefix cut is the heuristic's


@pytest.mark.parametrize("kind", ["prose", "code", "json"])
def test_the_bound_counts_every_byte_of_a_long_prompt(kind: str) -> None:
    """No sampling: a 300 KB prompt costs its bytes, wherever its expensive part sits."""
    text = _corpus(kind, 300_000)
    cheap = "a " * 40_000  # what a sampler's windows might see
    crafted = cheap + "\u4e00\u9fa5" * 30_000 + cheap
    assert ByteBound().count(text) == len(text.encode())
    assert ByteBound().count(crafted) == len(crafted.encode()) == 160_000 + 180_000
