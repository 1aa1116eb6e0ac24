from __future__ import annotations

from pathlib import Path

import pytest

from filters.errors import ConfigError
from filters.estimate import HeuristicEstimator, TokenizerEstimator, load_estimator


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
    est = load_estimator(str(path))
    assert isinstance(est, TokenizerEstimator)
    assert est.count("hello world weir river") == 4
    assert est.prefix_chars("hello world weir", 2) == len("hello world")
    assert est.prefix_chars("hello", 5) == 5
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError):
        TokenizerEstimator(bad)
