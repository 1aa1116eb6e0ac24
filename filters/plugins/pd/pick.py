"""Which prefill and which decode replica serve a request: pure functions over the gateway's
own view of its replicas (requests and tokens it has in flight on each, recent failures).

- **prefill**: rendezvous hashing of the prompt's start over the live prefill replicas, so a
  shared prefix lands where it is cached, bounded by load: a replica already holding more than
  ``slack`` x the mean backlog (prompt tokens in flight; at least ``floor`` tokens, about two
  chunked-prefill steps, below which a replica is as good as idle) is passed over for the next
  in hash order (the bounded-load rule of Envoy's ring hash, on tokens);
- **decode**: the replica with the fewest tokens held by the gateway's requests on it (prompt
  + the tokens each may still generate: its KV), then the fewest requests (its running batch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

__all__ = ["pick_decode", "pick_prefill", "rendezvous_order"]


def rendezvous_order(key: bytes, replicas: Sequence[str]) -> list[str]:
    """``replicas`` in highest-random-weight order for ``key`` (stable across processes)."""

    def weight(replica: str) -> bytes:
        return hashlib.blake2b(key + b"\x00" + replica.encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


def pick_prefill(
    key: bytes,
    replicas: Sequence[str],
    backlog: Mapping[str, int],
    cost: int,
    *,
    ejected: frozenset[str] = frozenset(),
    slack: float = 1.25,
    floor: int = 8192,
) -> str:
    """The prefill replica for a prompt of ``cost`` tokens whose start is ``key``."""
    if not replicas:
        raise ValueError("no prefill replica")
    live = [r for r in replicas if r not in ejected] or list(replicas)
    total = sum(backlog.get(r, 0) for r in live) + cost
    bound = max(slack * total / len(live), floor) + cost
    order = rendezvous_order(key, live)
    for replica in order:
        if backlog.get(replica, 0) + cost <= bound:
            return replica
    return min(order, key=lambda r: backlog.get(r, 0))


def pick_decode(
    replicas: Sequence[str], tokens: Mapping[str, int], requests: Mapping[str, int]
) -> str:
    """The decode replica with the most KV headroom, as far as the gateway's requests go."""
    if not replicas:
        raise ValueError("no decode replica")
    return min(replicas, key=lambda r: (tokens.get(r, 0), requests.get(r, 0)))
