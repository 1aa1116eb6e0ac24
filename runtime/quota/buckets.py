"""Token bucket arithmetic shared by the Lua scripts' Python twin and the read-only peek."""

from __future__ import annotations

__all__ = ["refill"]


def refill(tk: float, ts: int, now_us: int, cap: int, rate: float) -> tuple[float, int]:
    """The bucket ``(tokens, last µs)`` refilled at ``rate``/s up to ``cap`` as of ``now_us``."""
    if now_us > ts:
        tk = tk + (now_us - ts) * rate / 1000000
        ts = now_us
    if tk > cap:
        tk = float(cap)
    return tk, ts
