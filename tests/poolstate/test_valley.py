"""What the batch runners publish of their lines on a pool, and the level the degradation
ladder reads without them (poolstate/valley.py)."""

from __future__ import annotations

import pytest

from poolstate.valley import (
    MAX_AGE_S,
    RunnerWord,
    fresh_total,
    fresh_words,
    ladder_level,
    valley_key,
)


def test_fields_written_lately_add_up_and_the_rest_count_nothing() -> None:
    now = 1_000.0
    fields: dict[bytes | str, bytes | str] = {
        b"runner-0": RunnerWord(30, now - 0.3, 7, 700, 70).encode().encode(),  # as redis-py
        "runner-1": RunnerWord(12, now).encode(),
        "runner-2": RunnerWord(40, now - MAX_AGE_S - 0.1).encode(),  # gone quiet: a dead runner
        "runner-3": RunnerWord(40, now + MAX_AGE_S + 0.1).encode(),  # a clock far ahead
        "runner-4": "garbage",
        "runner-5": "7 not-a-time 0 0 0",
        "runner-6": "7 nan 0 0 0",
        "runner-7": "7 1000.0",  # too few numbers
        "runner-8": "-7 1000.0 0 0 0",  # impossible
        "runner-9": RunnerWord(0, now).encode(),  # stopped
    }
    assert fresh_total(fields, now) == 42
    words = fresh_words(fields, now)
    assert set(words) == {"runner-0", "runner-1", "runner-9"}
    assert words["runner-0"] == RunnerWord(30, now - 0.3, 7, 700, 70)
    assert fresh_total({}, now) == 0


def test_a_word_reads_back_as_written() -> None:
    word = RunnerWord(3, 1234.5, 10, 2000, 300)
    assert RunnerWord.decode(word.encode()) == word
    assert RunnerWord.decode(word.encode().encode()) == word
    assert RunnerWord(-3, 1.0, -1, -1, -1).encode() == "0 1.000 0 0 0"  # never negative


def test_the_ladder_reads_the_saturation_less_the_runners_share_of_the_slots() -> None:
    assert ladder_level(0.9, 48, 64) == pytest.approx(0.15)
    assert ladder_level(0.9, 0, 64) == 0.9
    assert ladder_level(0.9, 48, 0) == 0.9  # capacity unknown: nothing left out
    assert ladder_level(0.5, 64, 64) == 0.0  # never below 0 (the runner's count ahead of
    # the sample's)
    assert ladder_level(1.4, 32, 64) == pytest.approx(0.9)  # a queue: still the lines' share


def test_one_hash_per_pool_in_one_cluster_slot() -> None:
    assert valley_key("chat") == "tw:valley:{chat}"
