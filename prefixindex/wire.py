"""SGLang's KV-cache events on the wire (``python/sglang/srt/disaggregation/kv_events.py``).

A publisher sends ZMQ PUB multipart messages ``(topic, seq, payload)``: ``seq`` is an 8-byte
big-endian counter from 0 per publisher process; ``payload`` is msgpack of
``KVEventBatch(ts, events)`` encoded as an array (msgspec ``array_like``), each event a tagged
array whose first element is its class name::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

(``medium`` appeared in newer SGLang; both shapes decode.) The optional ROUTER replay socket takes
``(b"", start seq as 8 bytes big-endian)`` from a DEALER/REQ and answers ``(b"", seq, payload)`` for
every buffered batch with ``seq >= start``, then ``(b"", -1 as 8 signed bytes, b"")``.

``KvEventsConfig`` is the ``--kv-events-config`` JSON, with SGLang's keys and defaults.

The index reads batches with :func:`decode_for_index`: the same wire format and the same checks,
but only what the index keeps is built. A stored block's ``token_ids`` are never decoded (the
index keys on block hashes; at page size 1 that list was about half of decoding a batch), and
with ``anchor_every`` > 1 only the *anchor* hashes are (those whose low bits are zero,
:func:`is_anchor`): the msgpack array of 64-bit integers is scanned at C speed (every item is 9
bytes: ``0xcf``/``0xd3`` and 8 big-endian bytes) and the rest are skipped; an array in any other
shape is decoded by msgspec and filtered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache

import msgspec

from prefixindex.errors import KvEventDecodeError, KvEventsConfigError
from wire.jsontypes import JsonObject, JsonValue

__all__ = [
    "END_SEQ",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "IndexBatch",
    "KVEventBatch",
    "KvEvent",
    "KvEventsConfig",
    "RemovedBlocks",
    "StoredBlocks",
    "anchor_mask",
    "connect_address",
    "decode_batch",
    "decode_for_index",
    "decode_frame",
    "decode_index_frame",
    "decode_seq",
    "encode_batch",
    "encode_frame",
    "encode_seq",
    "is_anchor",
    "keep_anchors",
    "should_bind",
]

MEDIUM_GPU = "GPU"
END_SEQ = -1


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (the tag is the class name, as in SGLang)."""


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(_Event):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KvEvent]


class _RawStored(_Event, tag="BlockStored"):
    """A ``BlockStored`` as the index decodes it: its arrays kept as raw msgpack bytes."""

    block_hashes: msgspec.Raw
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: str | None = None


class _RawRemoved(_Event, tag="BlockRemoved"):
    block_hashes: msgspec.Raw
    medium: str | None = None


class _RawBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_RawStored | _RawRemoved | AllBlocksCleared]


@dataclass(slots=True)
class StoredBlocks:
    """A ``BlockStored`` as the index reads it: the anchor hashes only (all of them when
    ``anchor_every`` is 1); the token ids are not decoded."""

    block_hashes: list[int]
    parent_block_hash: int | None
    block_size: int
    medium: str | None = None
    stored: int = 0  # blocks the event stored, anchors or not (the replica's prefill progress)


@dataclass(slots=True)
class RemovedBlocks:
    """A ``BlockRemoved`` as the index reads it (anchor hashes only)."""

    block_hashes: list[int]
    medium: str | None = None


@dataclass(slots=True)
class IndexBatch:
    """A ``KVEventBatch`` as the index reads it: hashes already filtered to ``anchor_every``."""

    ts: float
    events: list[StoredBlocks | RemovedBlocks | AllBlocksCleared]
    anchor_every: int = 1


def anchor_mask(anchor_every: int) -> int:
    """The low-bit mask of ``anchor_every`` (a power of two from 1 to 256)."""
    if anchor_every < 1 or anchor_every > 256 or anchor_every & (anchor_every - 1):
        raise ValueError(f"anchor_every: {anchor_every} is not a power of two from 1 to 256")
    return anchor_every - 1


def is_anchor(block_hash: int, mask: int) -> bool:
    """An anchor block: the low bits of its hash under ``mask`` are zero (``mask`` 0: all)."""
    return not block_hash & mask


def keep_anchors(hashes: list[int], mask: int) -> list[int]:
    """The anchors of ``hashes``, in order (``hashes`` itself when ``mask`` is 0)."""
    return [h for h in hashes if not h & mask] if mask else hashes


@cache
def _low_byte_table(mask: int) -> bytes:
    return bytes(1 if not i & mask else 0 for i in range(256))


_INT_ITEM = 9  # 0xcf (uint64) or 0xd3 (int64) + 8 bytes big-endian
_INT_TYPES = b"\xcf\xd3"
_HASHES = msgspec.msgpack.Decoder(list[int])


def _array_start(raw: bytes) -> tuple[int, int] | None:
    """``(items, offset of the first item)`` of a msgpack array header, or None."""
    if not raw:
        return None
    head = raw[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F, 1
    if head == 0xDC and len(raw) >= 3:
        return int.from_bytes(raw[1:3], "big"), 3
    if head == 0xDD and len(raw) >= 5:
        return int.from_bytes(raw[1:5], "big"), 5
    return None


def _array_len(field: msgspec.Raw) -> int:
    """Items in a msgpack array kept raw (its header only is read; 0 if it is not an array)."""
    start = _array_start(bytes(memoryview(field)[:5]))
    return start[0] if start is not None else 0


def _anchor_hashes(field: msgspec.Raw, mask: int) -> list[int]:
    """The anchor hashes of a msgpack array of integers (all of them when ``mask`` is 0)."""
    if mask:
        raw = bytes(field)
        start = _array_start(raw)
        if start is not None:
            items, off = start
            if len(raw) - off == _INT_ITEM * items and not raw[off::_INT_ITEM].translate(
                None, _INT_TYPES
            ):
                # every item a 9-byte integer: look at the low bytes only, decode the anchors
                lows = raw[off + _INT_ITEM - 1 :: _INT_ITEM].translate(_low_byte_table(mask))
                out: list[int] = []
                find, from_bytes = lows.find, int.from_bytes
                i = find(1)
                while i >= 0:
                    at = off + _INT_ITEM * i
                    out.append(from_bytes(raw[at + 1 : at + 9], "big", signed=raw[at] == 0xD3))
                    i = find(1, i + 1)
                return out
    try:
        hashes = _HASHES.decode(field)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a KVEventBatch: block_hashes: {exc}") from exc
    return keep_anchors(hashes, mask)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_INDEX_DECODER = msgspec.msgpack.Decoder(_RawBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a KVEventBatch: {exc}") from exc


def decode_for_index(payload: bytes, anchor_every: int = 1) -> IndexBatch:
    """One batch as the index reads it (token ids not decoded, only anchor hashes kept);
    checked like :func:`decode_batch`, and all of it before anything is returned."""
    mask = anchor_mask(anchor_every)
    try:
        raw = _INDEX_DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a KVEventBatch: {exc}") from exc
    events: list[StoredBlocks | RemovedBlocks | AllBlocksCleared] = []
    for e in raw.events:
        if isinstance(e, _RawStored):
            hashes = _anchor_hashes(e.block_hashes, mask)
            events.append(
                StoredBlocks(
                    hashes, e.parent_block_hash, e.block_size, e.medium, _array_len(e.block_hashes)
                )
            )
        elif isinstance(e, _RawRemoved):
            events.append(RemovedBlocks(_anchor_hashes(e.block_hashes, mask), e.medium))
        else:
            events.append(e)
    return IndexBatch(raw.ts, events, anchor_every)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def decode_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise KvEventDecodeError(f"sequence number has {len(raw)} bytes, 8 expected")
    return int.from_bytes(raw, "big", signed=True)


def encode_frame(topic: str, seq: int, batch: KVEventBatch) -> list[bytes]:
    """The PUB multipart message for one batch."""
    return [topic.encode(), encode_seq(seq), encode_batch(batch)]


def decode_frame(parts: Sequence[bytes]) -> tuple[str, int, KVEventBatch]:
    """``(topic, seq, batch)`` of one PUB message."""
    _check_parts(parts)
    return parts[0].decode(errors="replace"), decode_seq(parts[1]), decode_batch(parts[2])


def decode_index_frame(parts: Sequence[bytes], anchor_every: int = 1) -> tuple[int, IndexBatch]:
    """``(seq, batch)`` of one PUB message, as the index reads it."""
    _check_parts(parts)
    return decode_seq(parts[1]), decode_for_index(parts[2], anchor_every)


def _check_parts(parts: Sequence[bytes]) -> None:
    if len(parts) != 3:
        raise KvEventDecodeError(f"KV-event message has {len(parts)} parts, 3 expected")


def should_bind(endpoint: str) -> bool:
    """SGLang's rule: bind when the endpoint has a wildcard or is ipc/inproc, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def connect_address(endpoint: str, host: str) -> str:
    """The address a subscriber connects to for a bound ``endpoint`` (``*`` → ``host``)."""
    return endpoint.replace("*", host, 1)


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """``--kv-events-config``: SGLang's keys and defaults (``publisher`` "null" = off)."""

    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> KvEventsConfig:
        """Parse the flag's JSON; KvEventsConfigError names the key and what is allowed."""
        try:
            raw: JsonValue = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KvEventsConfigError(f"kv-events-config: not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise KvEventsConfigError("kv-events-config: must be a JSON object")
        for key in raw:
            if key not in _KEYS:
                allowed = ", ".join(sorted(_KEYS))
                raise KvEventsConfigError(
                    f"kv-events-config: unknown key {key!r}; allowed: {allowed}"
                )
        d = cls()
        publisher = raw.get("publisher", d.publisher)
        if publisher not in ("null", "zmq"):
            raise KvEventsConfigError(
                f"kv-events-config: publisher: {publisher!r} is not allowed; allowed: null, zmq"
            )
        endpoint = _text(raw, "endpoint", d.endpoint)
        topic = _text(raw, "topic", d.topic)
        replay = raw.get("replay_endpoint", d.replay_endpoint)
        if replay is not None and not isinstance(replay, str):
            raise KvEventsConfigError("kv-events-config: replay_endpoint: must be a string or null")
        buffer_steps = _count(raw, "buffer_steps", d.buffer_steps)
        hwm = _count(raw, "hwm", d.hwm)
        max_queue_size = _count(raw, "max_queue_size", d.max_queue_size)
        for key, value in (("endpoint", endpoint), ("replay_endpoint", replay)):
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise KvEventsConfigError(
                    f"kv-events-config: {key}: {value!r} must start with tcp://, ipc:// or inproc://"
                )
        return cls(
            "zmq" if publisher == "zmq" else "null", endpoint, replay, buffer_steps, hwm,
            max_queue_size, topic,
        )  # fmt: skip

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in _KEYS if k != "max_queue_size"})


def _text(raw: JsonObject, key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise KvEventsConfigError(f"kv-events-config: {key}: must be a string")
    return value


def _count(raw: JsonObject, key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvEventsConfigError(f"kv-events-config: {key}: must be an integer >= 1")
    return value


_KEYS = tuple(f.name for f in fields(KvEventsConfig))  # SGLang's keys, in its order
