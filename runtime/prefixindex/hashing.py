"""Block hashes exactly as SGLang's radix cache computes them for its KV events.

SGLang (``mem_cache/radix_cache.py``, ``compute_node_hash_values``; ``get_hash_str`` and
``hash_str_to_int64``) cuts a sequence into pages of ``page_size`` tokens; each page's digest is
``sha256(parent digest (32 raw bytes, absent for the first page) || each token id as 4 bytes
little-endian unsigned)``. The event carries the first 8 bytes of the digest read big-endian as
a **signed** 64-bit integer. So a block hash names the whole prefix up to and including its page:
equal hashes mean equal prefixes (up to 2**-64 collisions).

Only whole pages are hashed (a partial last page is never cached). The chain runs from the root of
the tree, so two replicas with the same page size and tokenizer give the same hashes.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Iterator, Sequence

__all__ = ["block_id", "chain_digests", "page_digest", "prefix_block_ids"]

_SWAP = sys.byteorder != "little"  # token ids hash as 4-byte little-endian
_SIGN = 1 << 63
_WRAP = 1 << 64


def page_digest(tokens: Sequence[int], prior: bytes | None) -> bytes:
    """The 32-byte SHA-256 digest of one page chained onto ``prior`` (None for the first page)."""
    hasher = hashlib.sha256()
    if prior:
        hasher.update(prior)
    hasher.update(b"".join(t.to_bytes(4, "little", signed=False) for t in tokens))
    return hasher.digest()


def block_id(digest: bytes) -> int:
    """The signed 64-bit block hash an event carries for ``digest``."""
    value = int.from_bytes(digest[:8], "big")
    return value - _WRAP if value >= _SIGN else value


def chain_digests(
    tokens: Sequence[int], page_size: int, prior: bytes | None = None
) -> Iterator[bytes]:
    """Digests of each whole page of ``tokens``, chained from ``prior``."""
    if page_size <= 0:
        raise ValueError("page_size must be > 0")
    whole = len(tokens) - len(tokens) % page_size
    if not whole:
        return
    packed = array.array("I", tokens[:whole])  # one pass in C instead of a join per page
    if _SWAP:
        packed.byteswap()
    raw = packed.tobytes()
    width = 4 * page_size
    sha = hashlib.sha256
    digest = prior or b""
    for begin in range(0, len(raw), width):
        digest = sha(digest + raw[begin : begin + width]).digest()
        yield digest


def prefix_block_ids(tokens: Sequence[int], page_size: int) -> list[int]:
    """Block hashes of every whole page of ``tokens`` from the root, in order."""
    return [block_id(d) for d in chain_digests(tokens, page_size)]
