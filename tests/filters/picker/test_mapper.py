"""Checkpoints and the checkpoint → block-hash map: exact against SGLang's hashing of the
emulator's tokens, incremental, and bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.emulator.tokenizer import encode, render_chat
from filters.plugins.picker.cuts import cut_end
from filters.plugins.picker.mapper import ROOT, CheckpointMap, map_points
from filters.plugins.picker.prompt import checkpoints, prompt_bytes, render_emulator_chat
from prefixindex.hashing import prefix_block_ids

WORDS = st.lists(
    st.sampled_from(["a", "bb", "ccc", "dddd", "e\u00e9", "ff\nf", "g\tg"]), max_size=80
)


def _expected(data: bytes, cut: int, page: int, every: int = 1) -> tuple[int, int | None]:
    """(tokens, block) at a cut: the words that end before it, SGLang-hashed, up to the last
    page whose block is an anchor (every page when ``every`` is 1)."""
    head = data[:cut]
    words = head.split()
    if words and not head[-1:].isspace():
        words.pop()
    ids = encode(b" ".join(words).decode())
    blocks = prefix_block_ids(ids, page)
    anchors = [i for i, b in enumerate(blocks) if b % every == 0]
    if not anchors:
        return 0, None
    return (anchors[-1] + 1) * page, blocks[anchors[-1]]


@settings(max_examples=80, deadline=None)
@given(WORDS, st.integers(1, 4), st.integers(3, 40), st.sampled_from([1, 1, 2, 4, 16]))
def test_each_checkpoint_names_the_backends_block_hash(
    words: list[str], page: int, step: int, every: int
) -> None:
    data = " ".join(words).encode()
    marks = checkpoints(data, step)
    cmap = CheckpointMap(page, step, anchor_every=every)
    assert cmap.extend(data, marks, 0, len(marks)) == len(marks)
    points = cmap.lookup(marks)
    assert len(points) == len(marks)
    for k, point in enumerate(points, start=1):
        assert (point.cached_tokens, point.block) == _expected(data, cut_end(k, step), page, every)


@settings(max_examples=40, deadline=None)
@given(WORDS, st.integers(1, 3), st.integers(3, 20), st.sampled_from([1, 4]), st.data())
def test_mapping_a_slice_from_its_offset_gives_the_same_points(
    words: list[str], page: int, step: int, every: int, data: st.DataObject
) -> None:
    # what the pool's mapper sends its worker process: the bytes from the resume point only
    text = " ".join(words).encode()
    marks = checkpoints(text, step)
    whole = map_points(text, ROOT, 0, len(marks), step, page, every)
    known = data.draw(st.integers(0, len(marks)))
    start = ROOT if known == 0 else whole[known - 1]
    rest = len(marks) - known
    cut = text[start.resume : cut_end(len(marks), step)]
    assert map_points(cut, start, known, rest, step, page, every, start.resume) == whole[known:]
    with pytest.raises(ValueError):
        map_points(cut, start, known, rest, step, page, every, start.resume + 1)


def test_a_conversation_resumes_where_its_last_turn_was_mapped() -> None:
    turn1 = " ".join(f"w{i}" for i in range(400)).encode()
    turn2 = turn1 + b" answer words and a new question " + b"x " * 200
    cmap = CheckpointMap(1, 64)
    m1 = checkpoints(turn1, 64)
    cmap.extend(turn1, m1, 0, len(m1))
    hashed = cmap.tokens_hashed
    m2 = checkpoints(turn2, 64)
    known = len(cmap.lookup(m2))
    assert known == len(m1)  # the shared text is found
    cmap.extend(turn2, m2, known, len(m2))
    assert cmap.tokens_hashed - hashed < 260  # only the new text was tokenized and hashed
    assert cmap.lookup(m2)[-1].block == _expected(turn2, len(m2) * 64, 1)[1]


def test_the_map_is_bounded_least_recently_used_first() -> None:
    cmap = CheckpointMap(1, 8, max_points=5)
    data = " ".join("abcdefghijklmnopqrstuvwxyz" * 2).encode()
    marks = checkpoints(data, 8)
    assert len(marks) > 5
    cmap.extend(data, marks, 0, len(marks))
    assert len(cmap) == 5
    assert cmap.lookup(marks) == []  # the first checkpoints went first: nothing in a row


def test_prompt_rendering_matches_the_emulator() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
        },
        {"role": "assistant", "content": None},
    ]
    assert render_emulator_chat(messages) == render_chat(messages)
    assert prompt_bytes("chat", {"messages": messages}) == render_chat(messages).encode()
    assert prompt_bytes("generate", {"text": "x y"}) == b"x y"
    assert prompt_bytes("completion", {"prompt": ["x y"]}) == b"x y"
    assert prompt_bytes("completion", {"prompt": [1, 2]}) is None
    assert render_emulator_chat([{"role": "robot", "content": "x"}]) is None


def test_checkpoints_name_whole_prefixes() -> None:
    a, b = checkpoints(b"0123456789", 4), checkpoints(b"01234567zz", 4)
    assert a == b and len(a) == 2
    assert checkpoints(b"0123x567", 4)[1] != a[1]
    with pytest.raises(ValueError):
        checkpoints(b"", 0)


def test_a_salt_makes_other_checkpoints_and_is_bounded() -> None:
    """An adapter's seed (12 bytes) is padded to 16: the salted prompt never shares a digest
    with the same or any unsalted text, even one that starts with the seed's bytes."""
    seed = b"lora" + (7).to_bytes(8, "big")
    text = b"0123456789abcdef" * 4
    salted = checkpoints(text, 16, seed)
    assert len(salted) == 4 and not set(salted) & set(checkpoints(text, 16))
    assert not set(salted) & set(checkpoints(seed + text, 16))
    assert not set(salted) & set(checkpoints(seed.ljust(16, b"\0") + text, 16))
    assert checkpoints(text, 16, seed) == salted
    with pytest.raises(ValueError, match="at most 16 bytes"):
        checkpoints(text, 16, b"x" * 17)


@settings(max_examples=40, deadline=None)
@given(WORDS, WORDS, st.integers(1, 3), st.integers(3, 30), st.sampled_from([1, 4]))
def test_a_batch_maps_like_one_prompt_at_a_time_and_hashes_shared_text_once(
    head: list[str], tail: list[str], page: int, step: int, every: int
) -> None:
    """map_batch of a turn, its next turn and the turn again (as a busy mapper queues them)
    gives each the points map_points gives it alone; the text they share is hashed once."""
    from filters.plugins.picker.mapper import Job, map_batch

    turn1 = " ".join(head).encode()
    turn2 = turn1 + b" " + " ".join(tail).encode()
    jobs: list[Job] = []
    alone = []
    for data in (turn1, turn2, turn1):
        marks = checkpoints(data, step)
        jobs.append((marks, data, ROOT, 0, len(marks), 0))
        alone.append(map_points(data, ROOT, 0, len(marks), step, page, every))
    results = map_batch(jobs, step, page, every)
    assert [points for points, _ in results] == alone
    hashed = [n for _, n in results]
    assert hashed[0] == (alone[0][-1].tokens if alone[0] else 0)
    assert hashed[2] == 0  # the same prompt again: nothing new
    shared = len(alone[0])  # turn 2 resumes after turn 1's last checkpoint
    if alone[1]:
        base = alone[1][shared - 1].tokens if shared else 0
        assert hashed[1] == alone[1][-1].tokens - base
