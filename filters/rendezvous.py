"""Rendezvous (highest random weight) hashing: a replica's weight for a key, the same in every
gateway replica and every run (CRC-32, no per-process seed), so two filter servers asked about
the same key and the same replicas break a tie alike. Used by the picker's scoring and by the
admission plugin's lane balance."""

from __future__ import annotations

import zlib

__all__ = ["rendezvous"]


def rendezvous(key: bytes, name: str) -> int:
    """``name``'s weight for ``key``: CRC-32 of the name, seeded with the key's CRC-32."""
    return zlib.crc32(name.encode(), zlib.crc32(key))
