"""Request header blocks: HPACK decoding (the ``hpack`` package, so Huffman strings and the
peer's dynamic table work) with the header list size bound, and a cache of whole blocks."""

from __future__ import annotations

from hpack import Decoder

from runtime.h2 import frames as f

__all__ = ["Decoded", "HeaderDecoder"]

Decoded = tuple[tuple[tuple[str, str], ...], str, float | None]
_HCACHE_MAX = 64  # distinct stream-opening header blocks remembered per connection


class HeaderDecoder:
    """``decode(block)`` → (non-pseudo headers, ``:path``, ``grpc-timeout`` in seconds)."""

    def __init__(self, max_header_list_size: int) -> None:
        self.decoder = Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self.hcache: dict[bytes, Decoded] = {}
        # the dynamic table's length, first entry (compared by identity) and size
        self.hstate: tuple[int, tuple[bytes, bytes] | None, int] = (-1, None, -1)

    def decode(self, block: bytes) -> Decoded:
        """A header block's non-pseudo headers, ``:path`` and ``grpc-timeout``, through
        :attr:`hcache`: Envoy opens every stream of a route with the same bytes, whose decoding
        (Huffman) is the costliest step per stream. A block that left the dynamic table as it
        was is cached while the table stays in that state (same first entry object, length and
        size), so a hit decodes exactly as the decoder would."""
        table = self.decoder.header_table
        entries = table.dynamic_entries
        state = (len(entries), entries[0] if entries else None, table.maxsize)
        if (
            state[0] != self.hstate[0]
            or state[1] is not self.hstate[1]
            or state[2] != self.hstate[2]
        ):
            self.hcache.clear()
            self.hstate = state
        hit = self.hcache.get(block)
        if hit is not None:
            return hit
        headers = self.decoder.decode(block)
        meta = tuple((str(k), str(v)) for k, v in headers if not str(k).startswith(":"))
        path = next((str(v) for k, v in headers if k == ":path"), "")
        timeout = next((f.parse_timeout(v) for k, v in meta if k == "grpc-timeout"), None)
        result = meta, path, timeout
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if after[0] != state[0] or after[1] is not state[1] or after[2] != state[2]:
            self.hcache.clear()
            self.hstate = after
        elif len(self.hcache) < _HCACHE_MAX:
            self.hcache[block] = result
        return result
