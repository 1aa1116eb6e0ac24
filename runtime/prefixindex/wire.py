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

The index reads batches with :func:`decode_for_index`: the same wire format, but a stored
block's ``token_ids`` stay undecoded (``msgspec.Raw``; the index keys on block hashes only). At
page size 1 a stored prompt carries one token id per block hash, so building that list was about
half of decoding a batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.prefixindex.errors import KvEventDecodeError, KvEventsConfigError

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
    "StoredBlocks",
    "connect_address",
    "decode_batch",
    "decode_for_index",
    "decode_frame",
    "decode_index_frame",
    "decode_seq",
    "encode_batch",
    "encode_frame",
    "encode_seq",
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


class StoredBlocks(_Event, tag="BlockStored"):
    """A ``BlockStored`` as the index reads it: ``token_ids`` kept as the raw msgpack bytes."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: str | None = None


class IndexBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A ``KVEventBatch`` as the index reads it (:class:`StoredBlocks` for stored blocks)."""

    ts: float
    events: list[StoredBlocks | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_INDEX_DECODER = msgspec.msgpack.Decoder(IndexBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a KVEventBatch: {exc}") from exc


def decode_for_index(payload: bytes) -> IndexBatch:
    """One batch as the index reads it (token ids not decoded); checked like :func:`decode_batch`."""
    try:
        return _INDEX_DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a KVEventBatch: {exc}") from exc


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


def decode_index_frame(parts: Sequence[bytes]) -> tuple[int, IndexBatch]:
    """``(seq, batch)`` of one PUB message, as the index reads it."""
    _check_parts(parts)
    return decode_seq(parts[1]), decode_for_index(parts[2])


def _check_parts(parts: Sequence[bytes]) -> None:
    if len(parts) != 3:
        raise KvEventDecodeError(f"KV-event message has {len(parts)} parts, 3 expected")


def should_bind(endpoint: str) -> bool:
    """SGLang's rule: bind when the endpoint has a wildcard or is ipc/inproc, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def connect_address(endpoint: str, host: str) -> str:
    """The address a subscriber connects to for a bound ``endpoint`` (``*`` → ``host``)."""
    return endpoint.replace("*", host, 1)


_DEFAULTS: dict[str, Any] = {
    "publisher": "null",
    "endpoint": "tcp://*:5557",
    "replay_endpoint": None,
    "buffer_steps": 10_000,
    "hwm": 100_000,
    "max_queue_size": 100_000,
    "topic": "",
}


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
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KvEventsConfigError(f"kv-events-config: not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise KvEventsConfigError("kv-events-config: must be a JSON object")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in _DEFAULTS:
                allowed = ", ".join(sorted(_DEFAULTS))
                raise KvEventsConfigError(
                    f"kv-events-config: unknown key {key!r}; allowed: {allowed}"
                )
            values[key] = value
        cfg = cls(**values)
        cfg._check()
        return cfg

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in _DEFAULTS if k != "max_queue_size"})

    def _check(self) -> None:
        if self.publisher not in ("null", "zmq"):
            raise KvEventsConfigError(
                f"kv-events-config: publisher: {self.publisher!r} is not allowed; allowed: null, zmq"
            )
        for key in ("endpoint", "topic"):
            if not isinstance(getattr(self, key), str):
                raise KvEventsConfigError(f"kv-events-config: {key}: must be a string")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise KvEventsConfigError("kv-events-config: replay_endpoint: must be a string or null")
        for key in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvEventsConfigError(f"kv-events-config: {key}: must be an integer >= 1")
        for key in ("endpoint", "replay_endpoint"):
            value = getattr(self, key)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise KvEventsConfigError(
                    f"kv-events-config: {key}: {value!r} must start with tcp://, ipc:// or inproc://"
                )
