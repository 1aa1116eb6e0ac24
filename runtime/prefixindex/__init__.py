"""The prefix index: which replicas hold which prompt prefixes, from SGLang's KV-cache events.

Pure parts: block hashing as SGLang does it (:mod:`.hashing`), the wire format of the events
(:mod:`.wire`). The emulator publishes with them; the filter server and the control plane
consume with them (docs/emulator.md, "KV events").
"""

from runtime.prefixindex.errors import KvEventDecodeError, KvEventsConfigError, PrefixIndexError
from runtime.prefixindex.hashing import block_id, chain_digests, page_digest, prefix_block_ids
from runtime.prefixindex.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KVEventBatch,
    KvEventsConfig,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KvEvent",
    "KvEventDecodeError",
    "KvEventsConfig",
    "KvEventsConfigError",
    "PrefixIndexError",
    "block_id",
    "chain_digests",
    "page_digest",
    "prefix_block_ids",
]
