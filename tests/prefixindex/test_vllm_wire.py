"""vLLM's KV events read into the index's own block hashes (prefixindex/vllm_wire.py)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from prefixindex.errors import KvEventDecodeError
from prefixindex.hashing import prefix_block_ids
from prefixindex.index import Applied, PrefixIndex
from prefixindex.vllm_wire import (
    VllmAllBlocksCleared,
    VllmBlockMap,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventBatch,
    encode_vllm_batch,
)
from prefixindex.wire import AllBlocksCleared, RemovedBlocks, StoredBlocks, encode_seq

PAGE = 4
TOKENS = list(range(100, 124))  # six blocks of four


def vhash(prior: bytes, block: list[int]) -> bytes:
    """A stand-in for vLLM's hash: any function of (parent, tokens) that is not ours."""
    return hashlib.sha256(b"vllm" + prior + repr(block).encode()).digest()


def vllm_chain(tokens: list[int], prior: bytes = b"seed") -> list[bytes]:
    out = []
    for i in range(0, len(tokens), PAGE):
        prior = vhash(prior, tokens[i : i + PAGE])
        out.append(prior)
    return out


HASHES = vllm_chain(TOKENS)


def stored(first: int, last: int, **more: object) -> VllmBlockStored:
    fields: dict[str, object] = {
        "block_hashes": HASHES[first:last],
        "parent_block_hash": HASHES[first - 1] if first else None,
        "token_ids": TOKENS[first * PAGE : last * PAGE],
        "block_size": PAGE,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    fields.update(more)
    return VllmBlockStored(**fields)  # type: ignore[arg-type]


def payload(*events: object) -> bytes:
    return encode_vllm_batch(VllmEventBatch(ts=1.0, events=list(events)))  # type: ignore[arg-type]


def test_stored_blocks_get_the_hashes_the_picker_computes_for_the_prompt_across_events() -> None:
    m = VllmBlockMap(PAGE)
    first = m.read(0, payload(stored(0, 2)))
    second = m.read(1, payload(stored(2, 6)))
    assert isinstance(first.events[0], AllBlocksCleared)  # batch 0: the publisher's baseline
    ours = prefix_block_ids(TOKENS, PAGE)
    a, b = first.events[1], second.events[0]
    assert isinstance(a, StoredBlocks) and isinstance(b, StoredBlocks)
    assert a.block_hashes + b.block_hashes == ours
    assert b.parent_block_hash == ours[1] and b.stored == 4


def test_the_older_array_encoding_with_integer_hashes_reads_the_same() -> None:
    ints = [int.from_bytes(h[:8], "big") for h in HASHES]
    old = [
        1.0,
        [["BlockStored", ints[:3], None, TOKENS[:12], PAGE, None]],
    ]
    got = VllmBlockMap(PAGE).read(5, msgspec.msgpack.encode(old))
    (event,) = got.events
    assert isinstance(event, StoredBlocks)
    assert event.block_hashes == prefix_block_ids(TOKENS[:12], PAGE)


def test_removals_go_through_the_map_even_when_a_replay_sends_them_again() -> None:
    m = VllmBlockMap(PAGE)
    m.read(0, payload(stored(0, 6)))
    gone = payload(VllmBlockRemoved(block_hashes=HASHES[4:], medium="GPU"))
    ours = prefix_block_ids(TOKENS, PAGE)
    for _ in range(2):  # live, then once more from a replay
        (event,) = m.read(1, gone).events
        assert isinstance(event, RemovedBlocks) and event.block_hashes == ours[4:]


def test_what_the_prompt_hash_cannot_name_is_left_out() -> None:
    m = VllmBlockMap(PAGE)
    batch = m.read(
        3,
        payload(
            stored(2, 4),  # its parent was never seen
            stored(0, 2, lora_name="adapter"),
            stored(0, 2, extra_keys=[["salt"], None]),
            stored(0, 2, group_idx=1),
            stored(0, 1, block_size=8, token_ids=TOKENS[:8]),
        ),
    )
    assert batch.events == [] and m.skipped_blocks == 2 + 2 + 2 + 2 + 1


def test_a_vllm_replica_in_the_index_answers_the_cached_prefix() -> None:
    m, index = VllmBlockMap(PAGE), PrefixIndex(PAGE)
    index.add_replica("a")
    assert index.apply("a", 0, m.read(0, payload(stored(0, 3)))) is Applied.APPLIED
    assert index.apply("a", 1, m.read(1, payload(VllmAllBlocksCleared()))) is Applied.APPLIED
    assert index.apply("a", 2, m.read(2, payload(stored(0, 5)))) is Applied.APPLIED
    index.heard("a", 0.0)
    assert index.query([*TOKENS, 1, 2], 0.0) == {"a": 20}


def test_anchors_only_and_the_bound_on_remembered_hashes() -> None:
    m = VllmBlockMap(PAGE, max_entries=3)
    (_, event) = m.read(0, payload(stored(0, 6)), anchor_every=2).events
    assert isinstance(event, StoredBlocks)
    ours = prefix_block_ids(TOKENS, PAGE)
    assert event.block_hashes == [h for h in ours if not h & 1] and event.stored == 6
    assert len(m) == 3  # the oldest three forgotten
    assert m.read(1, payload(stored(1, 2))).events == []  # its parent was forgotten


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "BlockMoved"}]}),
        msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": 3}]}),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1.5], None, [1, 2, 3, 4], 4, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, ["a"], 4, None]]]),
    ],
)
def test_malformed_batches_are_decode_errors(raw: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        VllmBlockMap(PAGE).read(1, raw)


def test_a_medium_that_is_not_a_string_is_a_decode_error_and_the_map_keeps_its_state() -> None:
    m = VllmBlockMap(PAGE)
    with pytest.raises(KvEventDecodeError, match="BlockStored: medium must be a string or null"):
        m.read(0, payload(stored(0, 2, medium=7)))
    assert len(m) == 0
    m.read(1, payload(stored(0, 2)))
    gone = msgspec.msgpack.encode([1.0, [["BlockRemoved", HASHES[:1], ["GPU"]]]])
    with pytest.raises(KvEventDecodeError, match="BlockRemoved: medium must be a string or null"):
        m.read(2, gone)
    assert len(m) == 2


def test_frames_need_three_parts() -> None:
    m = VllmBlockMap(PAGE)
    seq, batch = m.read_frame([b"", encode_seq(7), payload(stored(0, 1))])
    assert seq == 7 and len(batch.events) == 1
    with pytest.raises(KvEventDecodeError):
        m.read_frame([b"", encode_seq(7)])


def test_a_block_size_other_than_the_page_size_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = VllmBlockMap(PAGE, name="10.0.0.7:8000")
    wrong = stored(0, 1, block_size=8, token_ids=TOKENS[:8])
    with caplog.at_level("WARNING", logger="prefixindex"):
        m.read(1, payload(wrong))
        m.read(2, payload(wrong))
    (record,) = caplog.records
    assert "10.0.0.7:8000: block_size 8, but routing.page_size is 4" in record.getMessage()
