"""SGLang's KV-event wire format and block hashing, checked against hand-built SGLang shapes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixindex.errors import KvEventDecodeError, KvEventsConfigError
from prefixindex.hashing import prefix_block_ids
from prefixindex.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvEventsConfig,
    RemovedBlocks,
    StoredBlocks,
    decode_batch,
    decode_for_index,
    decode_frame,
    decode_index_frame,
    encode_batch,
    encode_frame,
    is_anchor,
    should_bind,
)


def _sglang_ids(tokens: list[int], page: int) -> list[int]:
    """SGLang's get_hash_str + hash_str_to_int64, written out independently (hex strings)."""
    out, prior = [], None
    for start in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[start : start + page]:
            h.update(struct.pack("<I", t))
        prior = h.hexdigest()
        value = int(prior[:16], 16)
        out.append(value - 2**64 if value >= 2**63 else value)
    return out


@given(st.lists(st.integers(0, 2**32 - 1), max_size=40), st.integers(1, 5))
def test_block_ids_match_sglangs_hex_chain(tokens: list[int], page: int) -> None:
    assert prefix_block_ids(tokens, page) == _sglang_ids(tokens, page)


def test_block_ids_chain_and_ignore_the_partial_page() -> None:
    ids = prefix_block_ids([1, 2, 3, 4, 5], 2)
    assert len(ids) == 2
    assert prefix_block_ids([1, 2, 3, 4], 2) == ids
    assert prefix_block_ids([9, 2, 3, 4], 2)[1] != ids[1]  # the parent is part of the hash


def test_decodes_sglang_batches_old_and_new_shapes() -> None:
    old = msgspec.msgpack.encode(
        [1.5, [["BlockStored", [7], None, [1, 2], 2, None], ["BlockRemoved", [7]]]]
    )
    new = msgspec.msgpack.encode(
        [2.0, [["BlockStored", [8], 7, [3], 1, None, "GPU"], ["AllBlocksCleared"]]]
    )
    assert decode_batch(old) == KVEventBatch(
        ts=1.5,
        events=[BlockStored([7], None, [1, 2], 2, None), BlockRemoved([7])],
    )
    assert decode_batch(new).events == [
        BlockStored([8], 7, [3], 1, None, "GPU"),
        AllBlocksCleared(),
    ]


def test_the_index_reads_the_same_batches_without_decoding_token_ids() -> None:
    old = msgspec.msgpack.encode(
        [1.5, [["BlockStored", [7, 9], None, [1, 2], 1, None], ["BlockRemoved", [7]]]]
    )
    new = msgspec.msgpack.encode(
        [2.0, [["BlockStored", [8], 7, [3], 1, None, "GPU"], ["AllBlocksCleared"]]]
    )
    a = decode_for_index(old)
    stored = a.events[0]
    assert isinstance(stored, StoredBlocks)
    assert (stored.block_hashes, stored.parent_block_hash, stored.block_size) == ([7, 9], None, 1)
    assert a.ts == 1.5 and a.events[1] == RemovedBlocks([7])
    b = decode_for_index(new)
    assert isinstance(b.events[0], StoredBlocks) and b.events[0].medium == "GPU"
    assert b.events[1] == AllBlocksCleared()
    parts = encode_frame("kv", 3, decode_batch(new))
    seq, again = decode_index_frame(parts)
    assert seq == 3 and again.events[0].block_hashes == [8]  # type: ignore[union-attr]
    with pytest.raises(KvEventDecodeError):
        decode_for_index(msgspec.msgpack.encode([1.0, [["BlockStored", "x"]]]))


INT64 = st.integers(-(2**63), 2**63 - 1)


@given(
    st.lists(st.one_of(INT64, st.integers(-300, 300)), max_size=60),
    st.lists(INT64, max_size=20),
    st.sampled_from([1, 2, 16, 256]),
)
def test_the_index_keeps_exactly_the_anchor_hashes_whatever_their_encoding(
    stored: list[int], removed: list[int], every: int
) -> None:
    # small values take msgpack's short encodings (fixint, int8...): the scan must notice and
    # leave those arrays to msgspec; random 64-bit hashes take the 9-byte one it reads itself
    raw = encode_batch(
        KVEventBatch(
            ts=1.0, events=[BlockStored(stored, None, [1], 1, None), BlockRemoved(removed)]
        )
    )
    got = decode_for_index(raw, every)
    mask = every - 1
    assert got.anchor_every == every
    assert got.events[0].block_hashes == [h for h in stored if is_anchor(h, mask)]  # type: ignore[union-attr]
    assert got.events[1].block_hashes == [h for h in removed if is_anchor(h, mask)]  # type: ignore[union-attr]


def test_uint64_hashes_and_malformed_arrays() -> None:
    big = [2**64 - 16, 2**63 + 32, 2**63 - 16]  # 0xcf on the wire
    raw = msgspec.msgpack.encode([1.0, [["BlockRemoved", big]]])
    assert decode_for_index(raw, 16).events[0].block_hashes == big  # type: ignore[union-attr]
    for bad in (["x"], [1.5], [2.0**70] * 3, [[1]], "ab", None):  # float64: 9 bytes too
        with pytest.raises(KvEventDecodeError, match="block_hashes"):
            decode_for_index(msgspec.msgpack.encode([1.0, [["BlockRemoved", bad]]]), 16)
    frame = bytearray(msgspec.msgpack.encode([1.0, [["BlockRemoved", [2**40] * 20]]]))
    at = frame.index(b"\xdc")
    frame[at + 2] = 21  # one item more than the array holds: msgspec must reject the frame
    with pytest.raises(KvEventDecodeError):
        decode_for_index(bytes(frame), 16)
    with pytest.raises(ValueError, match="power of two"):
        decode_for_index(raw, 3)


def test_frame_round_trip_and_wire_layout() -> None:
    batch = KVEventBatch(ts=3.0, events=[BlockRemoved([-5], "GPU")])
    parts = encode_frame("kv", 258, batch)
    assert parts[0] == b"kv" and parts[1] == (258).to_bytes(8, "big")
    assert msgspec.msgpack.decode(parts[2]) == [3.0, [["BlockRemoved", [-5], "GPU"]]]
    assert decode_frame(parts) == ("kv", 258, batch)


@pytest.mark.parametrize(
    "parts",
    [[b"t", b"\x00" * 8], [b"t", b"\x00" * 7, b"\x90"], [b"t", b"\x00" * 8, b"not msgpack"]],
)
def test_bad_frames_are_decode_errors(parts: list[bytes]) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_frame(parts)


def test_config_keys_defaults_and_errors() -> None:
    cfg = KvEventsConfig.from_json('{"publisher": "zmq", "replay_endpoint": "tcp://*:5558"}')
    assert cfg.enabled and cfg.endpoint == "tcp://*:5557" and cfg.buffer_steps == 10_000
    assert not KvEventsConfig.from_json("{}").enabled
    every = KvEventsConfig("zmq", "tcp://*:1", "ipc:///r", 3, 4, 5, "kv")
    assert KvEventsConfig.from_json(json.dumps(dataclasses.asdict(every))) == every
    for bad, words in [
        ('{"publisher": "kafka"}', "allowed: null, zmq"),
        ('{"endpont": "tcp://*:1"}', "unknown key 'endpont'"),
        ('{"hwm": 0}', "hwm: must be an integer >= 1"),
        ('{"max_queue_size": true}', "max_queue_size: must be an integer >= 1"),
        ('{"publisher": 1}', "publisher: 1 is not allowed"),
        ('{"topic": 1}', "topic: must be a string"),
        ('{"replay_endpoint": 1}', "replay_endpoint: must be a string or null"),
        ('{"replay_endpoint": "udp://x"}', "replay_endpoint: 'udp://x' must start with tcp://"),
        ('{"endpoint": "http://x"}', "must start with tcp://"),
        ("[1]", "must be a JSON object"),
        ("{", "not JSON"),
    ]:
        with pytest.raises(KvEventsConfigError, match=words.replace("(", r"\(")):
            KvEventsConfig.from_json(bad)


def test_bind_rule_is_sglangs() -> None:
    assert should_bind("tcp://*:5557") and should_bind("ipc:///tmp/x")
    assert not should_bind("tcp://10.0.0.1:5557")


@given(st.binary(max_size=200))
def test_the_small_input_sha256_is_sha256(data: bytes) -> None:
    from prefixindex import hashing

    assert hashing._sha256(data).digest() == hashlib.sha256(data).digest()


def test_without_the_builtin_sha256_the_chain_uses_hashlibs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefixindex import hashing

    def missing(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(hashing.importlib, "import_module", missing)
    assert hashing._small_input_sha256() is hashlib.sha256
