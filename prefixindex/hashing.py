"""Block hashes exactly as SGLang's radix cache computes them for its KV events.

SGLang (``mem_cache/radix_cache.py``, ``compute_node_hash_values``; ``get_hash_str`` and
``hash_str_to_int64``) cuts a sequence into pages of ``page_size`` tokens; each page's digest is
``sha256(parent digest (32 raw bytes, absent for the first page) || each token id as 4 bytes
little-endian unsigned)``. The event carries the first 8 bytes of the digest read big-endian as
a **signed** 64-bit integer. So a block hash names the whole prefix up to and including its page:
equal hashes mean equal prefixes (up to 2**-64 collisions).

Only whole pages are hashed (a partial last page is never cached). The chain runs from the root of
the tree, so two replicas with the same page size and tokenizer give the same hashes.

At page size 1 that is one SHA-256 call per token (the emulator's radix cache, the picker's
mapper), and for 36-byte inputs the call, not the hashing, is most of the cost: the standard
library's own SHA-256 (``_sha2`` from Python 3.12, ``_sha256`` before) answers such calls ~25%
faster than OpenSSL's through ``hashlib``, so :func:`raw_chain` uses it when it is there and gives
the same digests (checked at import; ``hashlib.sha256`` otherwise).
"""

from __future__ import annotations

import array
import hashlib
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, cast

__all__ = ["block_id", "chain_digests", "page_digest", "prefix_block_ids", "raw_chain"]

_SWAP = sys.byteorder != "little"  # token ids hash as 4-byte little-endian
_SIGN = 1 << 63
_WRAP = 1 << 64


class _Hash(Protocol):
    def digest(self) -> bytes: ...


def _small_input_sha256() -> Callable[[bytes], _Hash]:
    """The stdlib's built-in SHA-256 when it exists and agrees with ``hashlib``'s, else hashlib's."""
    for module in ("_sha2", "_sha256"):
        try:
            sha = importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
        probe = bytes(range(36))
        if sha(probe).digest() == hashlib.sha256(probe).digest():
            return cast(Callable[[bytes], _Hash], sha)
    return hashlib.sha256


_sha256 = _small_input_sha256()


def raw_chain(raw: bytes, width: int, prior: bytes = b"") -> list[bytes]:
    """The chained digest of each ``width``-byte page of ``raw`` (little-endian token ids,
    ``len(raw)`` a multiple of ``width``), from ``prior`` (b"" at the root)."""
    sha = _sha256
    digest = prior
    out = []
    for piece in [raw[i : i + width] for i in range(0, len(raw), width)]:
        digest = sha(digest + piece).digest()
        out.append(digest)
    return out


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
    yield from raw_chain(packed.tobytes(), 4 * page_size, prior or b"")


def prefix_block_ids(tokens: Sequence[int], page_size: int) -> list[int]:
    """Block hashes of every whole page of ``tokens`` from the root, in order."""
    return [block_id(d) for d in chain_digests(tokens, page_size)]
