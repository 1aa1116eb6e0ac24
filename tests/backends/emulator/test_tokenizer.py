from __future__ import annotations

import pytest

from backends.emulator.tokenizer import (
    OutputWords,
    encode,
    render_chat,
    token_id,
    trace_block_text,
)
from backends.errors import RequestError


def test_one_token_per_word_with_stable_ids() -> None:
    assert encode("a  b\nc") == [token_id("a"), token_id("b"), token_id("c")]
    assert token_id("hello") == 907060870  # crc32: stable across processes and versions
    assert encode("") == []


def test_next_turn_prompt_starts_with_previous_prompt_and_answer() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    answer = "hello you"
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    p1 = encode(render_chat(turn1)) + encode(answer)
    p2 = encode(render_chat(turn2))
    assert p2[: len(p1)] == p1


def test_text_parts_and_bad_messages() -> None:
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert render_chat(parts) == "<|user|> a b <|end|> <|assistant|>"
    for bad in ([], "x", [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}]):
        with pytest.raises(RequestError):
            render_chat(bad)


def test_output_words_are_deterministic_per_prompt() -> None:
    w = OutputWords.build()
    assert len(set(w.words)) == len(w.words) == 1024
    a = [w.rng_for(1, [1, 2, 3]).random() for _ in range(3)]
    b = [w.rng_for(1, [1, 2, 3]).random() for _ in range(3)]
    c = [w.rng_for(2, [1, 2, 3]).random() for _ in range(3)]
    assert a == b != c


def test_trace_blocks_have_exact_length_and_differ_from_the_first_token() -> None:
    assert len(encode(trace_block_text(7, 512))) == 512
    assert encode(trace_block_text(7, 10)) == encode(trace_block_text(7, 512))[:10]
    assert encode(trace_block_text(7, 1))[0] != encode(trace_block_text(8, 1))[0]
