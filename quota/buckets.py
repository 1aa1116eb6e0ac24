"""Token bucket arithmetic shared by the Lua scripts' Python twin and the read-only peek."""

from __future__ import annotations

import math

__all__ = ["bucket_ttl_ms", "refill"]


def refill(tk: float, ts: int, now_us: int, cap: int, rate: float) -> tuple[float, int]:
    """The bucket ``(tokens, last µs)`` refilled at ``rate``/s up to ``cap`` as of ``now_us``."""
    if now_us > ts:
        tk = tk + (now_us - ts) * rate / 1000000
        ts = now_us
    if tk > cap:
        tk = float(cap)
    return tk, ts


def bucket_ttl_ms(tk: float, cap: int, rate: float) -> int:
    """How long until the bucket is full again (a missing bucket is full): -1 means never."""
    if rate <= 0:
        return -1
    return math.ceil((cap - tk) * 1000 / rate) + 60000
