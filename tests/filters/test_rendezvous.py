"""Rendezvous weights are fixed by their definition: every gateway replica, every version."""

from __future__ import annotations

import zlib

from filters.rendezvous import rendezvous


def test_weights_are_the_keyed_crc_and_stable() -> None:
    assert rendezvous(b"k", "10.0.0.1:8000") == zlib.crc32(b"10.0.0.1:8000", zlib.crc32(b"k"))
    # pinned: a change here moves every tie-broken placement of a running mesh
    assert rendezvous(b"", "a") == 0xE8B7BE43
    names = [f"r{i}" for i in range(8)]
    winners = {max(names, key=lambda n: rendezvous(str(k).encode(), n)) for k in range(200)}
    assert len(winners) == 8  # keys spread over every replica
