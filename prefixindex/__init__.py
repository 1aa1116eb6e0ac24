"""The prefix index: which replicas hold which prompt prefixes, from SGLang's KV-cache events.

Pure parts: block hashing as SGLang does it (:mod:`.hashing`), the wire format of the events
(:mod:`.wire`), the index itself (:mod:`.index`). The I/O edge: :mod:`.subscriber` (ZMQ, asyncio),
imported on its own so the pure parts need no event loop. The emulator publishes with these; the
filter server and the control plane consume with them (docs/emulator.md, "KV events";
docs/operations.md, "Prefix index").
"""

from prefixindex.errors import KvEventDecodeError, KvEventsConfigError, PrefixIndexError
from prefixindex.hashing import block_id, chain_digests, page_digest, prefix_block_ids
from prefixindex.index import Applied, PrefixIndex, ReplicaView
from prefixindex.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KVEventBatch,
    KvEventsConfig,
)

__all__ = [
    "AllBlocksCleared",
    "Applied",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KvEvent",
    "KvEventDecodeError",
    "KvEventsConfig",
    "KvEventsConfigError",
    "PrefixIndex",
    "PrefixIndexError",
    "ReplicaView",
    "block_id",
    "chain_digests",
    "page_digest",
    "prefix_block_ids",
]
