"""vLLM's KV-cache events, read into the index's own block hashes.

vLLM (``vllm/distributed/kv_events.py``) publishes the same ZMQ frames as SGLang
(``(topic, 8-byte big-endian seq, msgpack payload)``, a ROUTER replay socket answering
``(seq, payload)`` pairs then seq -1) and the same event family, with these differences, read
from its source (no vLLM server was run for this):

- **Encoding.** vLLM up to 0.9 encoded ``KVEventBatch`` and its events as msgpack arrays (msgspec
  ``array_like``), like SGLang. Newer vLLM dropped ``array_like``: a batch is a map
  ``{"ts", "events", "data_parallel_rank"}`` and each event a map tagged ``"type"``
  (``"BlockStored"``, ``"BlockRemoved"``, ``"AllBlocksCleared"``). Both shapes decode here.
- **Fields.** ``BlockStored``: ``block_hashes``, ``parent_block_hash``, ``token_ids`` (the tokens of
  every block in the event), ``block_size``, ``lora_id`` and, newer, ``medium``, ``lora_name``,
  ``extra_keys`` (per block: multimodal hashes, LoRA name, cache salt), ``group_idx`` and the
  cache-spec kind; ``BlockRemoved``: ``block_hashes`` (+ ``medium``, ``group_idx``).
- **Block hashes.** vLLM hashes a block as ``hash_fn((parent hash, block token ids, extra keys))``
  (``--prefix-caching-hash-algo``: sha256 over pickle, sha256_cbor, xxhash, ...) from a seed
  ``NONE_HASH`` that older versions draw at random per process (unless ``PYTHONHASHSEED`` is
  set) and publishes 32 raw bytes, or a 64-bit integer with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``. A gateway cannot recompute those hashes for a prompt.

So the gateway does not use vLLM's hashes as keys. :class:`VllmBlockMap` (one per replica)
recomputes each stored block's hash the way the picker hashes prompts
(:mod:`prefixindex.hashing`: SHA-256 chained over 4-byte token ids) from the event's
``token_ids``, chained from the parent's hash it recomputed before, and remembers vLLM's hash →
its own digest. Removals are translated through that map. What cannot be placed is left out,
which only ever lowers the index's answer: a block whose parent it never saw, a block with extra
keys or a LoRA adapter (the prompt's hash would not name it), a KV-cache group other than the
first (hybrid models store each block once per group).

vLLM sends ``AllBlocksCleared`` only when its prefix cache is reset, not at start; a publisher's
sequence starts at 0 with an empty cache, so batch 0 is read as a baseline
(:meth:`VllmBlockMap.read` puts an ``AllBlocksCleared`` in front of it).
"""

from __future__ import annotations

import array
import itertools
import logging
import sys
from collections.abc import Mapping, Sequence

import msgspec

from prefixindex.errors import KvEventDecodeError
from prefixindex.hashing import block_id, raw_chain
from prefixindex.wire import (
    AllBlocksCleared,
    IndexBatch,
    RemovedBlocks,
    StoredBlocks,
    anchor_mask,
    decode_seq,
    keep_anchors,
)

__all__ = [
    "VllmAllBlocksCleared",
    "VllmBlockMap",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmEventBatch",
    "encode_vllm_batch",
    "external_hash",
]

_SWAP = sys.byteorder != "little"
log = logging.getLogger("prefixindex")


# -- the newer (map) encoding, as vLLM's structs produce it; the emulator's vllm flavour uses it --
class _VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of vLLM's tagged events (maps with ``"type"``: the class name)."""


class VllmBlockStored(_VllmEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[object] | None = None
    group_idx: int | None = None


class VllmBlockRemoved(_VllmEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class VllmAllBlocksCleared(_VllmEvent, tag="AllBlocksCleared"):
    pass


class VllmEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_ANY = msgspec.msgpack.Decoder()


def encode_vllm_batch(batch: VllmEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def external_hash(value: object) -> bytes | int:
    """vLLM's block hash as a dict key: raw bytes or an integer, as it came."""
    if isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise KvEventDecodeError(f"block hash: {type(value).__name__} is not bytes or an integer")


# -- decoding either shape into plain fields --------------------------------------------------
_STORED_ORDER = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx")  # fmt: skip
_REMOVED_ORDER = ("block_hashes", "medium", "group_idx")


def _fields(event: object) -> tuple[str, Mapping[str, object]]:
    """``(tag, fields)`` of one event, a map tagged ``type`` or an array tagged first."""
    if isinstance(event, dict):
        tag = event.get("type")
        return (tag if isinstance(tag, str) else ""), event
    if isinstance(event, list) and event and isinstance(event[0], str):
        tag, rest = event[0], event[1:]
        order = _STORED_ORDER if tag == "BlockStored" else _REMOVED_ORDER
        return tag, dict(zip(order, rest, strict=False))
    raise KvEventDecodeError("not a vLLM KV event: neither a tagged map nor a tagged array")


def _batch(payload: bytes) -> tuple[float, list[object]]:
    try:
        raw = _ANY.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"not a vLLM KVEventBatch: {exc}") from exc
    if isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    else:
        raise KvEventDecodeError("not a vLLM KVEventBatch: neither a map nor an array")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(events, list):
        raise KvEventDecodeError("not a vLLM KVEventBatch: ts or events missing")
    return float(ts), events


def _medium(f: Mapping[str, object], tag: str) -> str | None:
    value = f.get("medium")
    if value is not None and not isinstance(value, str):
        raise KvEventDecodeError(f"{tag}: medium must be a string or null")
    return value


def _packed(value: object) -> array.array[int]:
    """Token ids as 4-byte little-endian unsigned integers (what the chain hashes), checked in C:
    anything but a list of integers in 0..2**32-1 is a decode error."""
    if not isinstance(value, list):
        raise KvEventDecodeError("BlockStored: token_ids must be a list of integers")
    try:
        packed = array.array("I", value)
    except (TypeError, OverflowError) as exc:
        raise KvEventDecodeError(f"BlockStored: token_ids: {exc}") from exc
    if _SWAP:
        packed.byteswap()
    return packed


class VllmBlockMap:
    """One vLLM replica's block hashes → the index's; ``read`` turns its batches into
    :class:`IndexBatch` es. ``reset`` when the replica's process changes (its seed may too).

    A mapping is a fact about content (vLLM's hash names a token prefix), so it is kept when the
    block is evicted or a batch is not applied (a replay sends the batch again): only the
    bound ``max_entries`` drops the oldest ones."""

    def __init__(self, page_size: int, max_entries: int = 2_000_000, name: str = "") -> None:
        if page_size <= 0 or max_entries <= 0:
            raise ValueError("page_size and max_entries must be > 0")
        self.name = name
        self._warned_size = False
        self.page_size = page_size
        self.max_entries = max_entries
        self._digests: dict[bytes | int, bytes] = {}
        self.skipped_blocks = 0  # stored blocks left out (no parent, extra keys, other size)

    def __len__(self) -> int:
        return len(self._digests)

    def reset(self) -> None:
        self._digests.clear()

    def read_frame(self, parts: Sequence[bytes], anchor_every: int = 1) -> tuple[int, IndexBatch]:
        """``(seq, batch)`` of one PUB message."""
        if len(parts) != 3:
            raise KvEventDecodeError(f"KV-event message has {len(parts)} parts, 3 expected")
        seq = decode_seq(parts[1])
        return seq, self.read(seq, parts[2], anchor_every)

    def read(self, seq: int, payload: bytes, anchor_every: int = 1) -> IndexBatch:
        """Batch ``seq`` in the index's hashes; the whole batch is checked before the map
        changes (KvEventDecodeError names what is wrong)."""
        mask = anchor_mask(anchor_every)
        ts, raw_events = _batch(payload)
        parsed = [_fields(e) for e in raw_events]
        events: list[StoredBlocks | RemovedBlocks | AllBlocksCleared] = []
        if seq == 0:  # a publisher's first batch: its cache was empty
            events.append(AllBlocksCleared())
        for tag, f in parsed:
            if tag == "BlockStored":
                stored = self._stored(f, mask)
                if stored is not None:
                    events.append(stored)
            elif tag == "BlockRemoved":
                hashes = f.get("block_hashes")
                if not isinstance(hashes, list):
                    raise KvEventDecodeError("BlockRemoved: block_hashes must be a list")
                if f.get("group_idx") not in (None, 0):
                    continue
                ours = [self._digests.get(external_hash(h)) for h in hashes]
                ids = [block_id(d) for d in ours if d is not None]
                events.append(RemovedBlocks(keep_anchors(ids, mask), _medium(f, "BlockRemoved")))
            elif tag == "AllBlocksCleared":
                events.append(AllBlocksCleared())
            else:
                raise KvEventDecodeError(f"unknown vLLM KV event {tag!r}")
        return IndexBatch(ts, events, anchor_every)

    def _stored(self, f: Mapping[str, object], mask: int) -> StoredBlocks | None:
        hashes = f.get("block_hashes")
        if not isinstance(hashes, list):
            raise KvEventDecodeError("BlockStored: block_hashes must be a list")
        keys = [external_hash(h) for h in hashes]
        tokens = _packed(f.get("token_ids"))
        size = f.get("block_size")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise KvEventDecodeError("BlockStored: block_size must be a positive integer")
        medium = _medium(f, "BlockStored")  # checked before the map changes
        parent = f.get("parent_block_hash")
        extra = f.get("extra_keys")
        namespaced = (
            f.get("lora_id") is not None
            or f.get("lora_name") is not None
            or (isinstance(extra, list) and any(e is not None for e in extra))
        )
        if size != self.page_size and not self._warned_size:
            self._warned_size = True
            log.warning(
                "KV events from vLLM replica %s: block_size %d, but routing.page_size is %d: its "
                "blocks are left out (the picker routes by load); set the pool's "
                "routing.page_size to the servers' --block-size",
                self.name or "?", size, self.page_size,
            )  # fmt: skip
        if (
            namespaced
            or f.get("group_idx") not in (None, 0)
            or size != self.page_size
            or len(tokens) != size * len(keys)
        ):
            self.skipped_blocks += len(keys)
            return None
        prior = b""
        if parent is not None:
            known = self._digests.get(external_hash(parent))
            if known is None:  # its chain started before what this map saw
                self.skipped_blocks += len(keys)
                return None
            prior = known
        digests = raw_chain(tokens.tobytes(), 4 * size, prior)
        self._remember(keys, digests)
        ids = [block_id(d) for d in digests]
        return StoredBlocks(
            keep_anchors(ids, mask),
            block_id(prior) if prior else None,
            size,
            medium,
            len(ids),
        )

    def _remember(self, keys: list[bytes | int], digests: list[bytes]) -> None:
        table = self._digests
        table.update(zip(keys, digests, strict=True))
        excess = len(table) - self.max_entries
        if excess > 0:
            for key in list(itertools.islice(table, excess)):  # the oldest first
                del table[key]
