"""All limit arithmetic, backend-agnostic: the pure-Python twin of ``lua/reserve.lua`` and
``lua/settle.lua``. Both do the same IEEE-754 double operations in the same order, so the twin and
Redis reach identical decisions and remaining counts (tests/ratelimit_service/test_twin.py).

Time is passed in (``now_us``, integer microseconds). ``MemoryState`` is the twin's store: the
property test drives it beside Redis, and the service uses it as the local per-replica bucket
while Redis is down (fail-open).

Semantics (docs/quotas.md):

* reserve — every limit is checked; the request is admitted when every *enforced* (non-shadow)
  limit admits it. When admitted, each limit that admits is charged (a shadow limit that would deny
  is reported, not charged); token limits are written into the reservation record.
* settle — the record is removed (a second settle finds nothing: idempotent) and each charged
  token limit gets ``actual - charged``: a refund (a bucket never above its burst) or an extra
  charge (a bucket may go into debt, a window over its limit).
* a bucket is ``(tk, ts)``: tokens as a double, last update in µs; a missing bucket is full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quota.buckets import bucket_ttl_ms, refill

__all__ = [
    "Check",
    "MemoryState",
    "Outcome",
    "ReserveResult",
    "SettleResult",
    "bucket_ttl_ms",
    "refill",
    "reserve",
    "retry_after_us",
    "settle",
]


@dataclass(frozen=True, slots=True)
class Check:
    """One limit to check in a reserve: ``kind`` is ``b`` (bucket) or ``w`` (window)."""

    key: str
    kind: str
    cost: int
    limit: int
    rate: float
    reset_us: int
    shadow: bool
    settle: bool
    money: bool = False  # a usd limit: settled with the real price, not the token count


@dataclass(frozen=True, slots=True)
class Outcome:
    """``remaining`` after the charge when charged; ``retry_us`` 0 when it admits, -1 never."""

    ok: bool
    remaining: int
    retry_us: int


@dataclass(frozen=True, slots=True)
class ReserveResult:
    admitted: bool
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True, slots=True)
class SettleResult:
    found: bool
    delta: int = 0
    trace: str | None = None  # the traceparent stored with the reservation (tracing on)


@dataclass
class MemoryState:
    """In-memory store for the twin; expired entries vanish lazily (``purge``)."""

    buckets: dict[str, tuple[float, int, int]] = field(default_factory=dict)  # tk, ts, expire
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # used, expire
    # record → (expire, counter key → [charged, is_bucket, cap (a window: its limit), rate,
    # is_money, is_shadow]); the top-up twin (quota/topup.py) reads and charges it too
    records: dict[str, tuple[int, dict[str, list[float]]]] = field(default_factory=dict)
    traces: dict[str, str] = field(default_factory=dict)  # record → traceparent at reserve

    def purge(self, now_us: int) -> None:
        for key in [k for k, v in self.buckets.items() if 0 <= v[2] <= now_us]:
            del self.buckets[key]
        for key in [k for k, v in self.windows.items() if v[1] <= now_us]:
            del self.windows[key]
        for key in [k for k, v in self.records.items() if v[0] <= now_us]:
            del self.records[key]
        for key in [k for k in self.traces if k not in self.records]:
            del self.traces[key]

    def bucket(self, key: str, cap: int, now_us: int) -> tuple[float, int]:
        st = self.buckets.get(key)
        if st is None or 0 <= st[2] <= now_us:
            return float(cap), now_us
        return st[0], st[1]

    def put_bucket(self, key: str, tk: float, ts: int, cap: int, rate: float) -> None:
        ttl = bucket_ttl_ms(tk, cap, rate)
        self.buckets[key] = (tk, ts, -1 if ttl < 0 else ts + ttl * 1000)

    def window(self, key: str, now_us: int) -> int | None:
        st = self.windows.get(key)
        if st is None or st[1] <= now_us:
            return None
        return st[0]


def retry_after_us(cost: int, tk: float, cap: int, rate: float) -> int:
    if cost > cap or rate <= 0:
        return -1
    return math.ceil((cost - tk) * 1000000 / rate)


def reserve(
    state: MemoryState,
    record: str | None,
    checks: list[Check],
    now_us: int,
    ttl_ms: int,
    trace: str | None = None,
) -> ReserveResult:
    admitted = True
    seen: list[tuple[bool, float, int]] = []  # ok, tk or used, ts
    for c in checks:
        if c.kind == "b":
            tk, ts = refill(*state.bucket(c.key, c.limit, now_us), now_us, c.limit, c.rate)
            ok = tk >= c.cost
            seen.append((ok, tk, ts))
        else:
            used = state.window(c.key, now_us) or 0
            ok = used + c.cost <= c.limit
            seen.append((ok, float(used), 0))
        if not ok and not c.shadow:
            admitted = False
    outcomes = []
    for c, (ok, value, ts) in zip(checks, seen, strict=True):
        charge = admitted and ok
        if c.kind == "b":
            if charge:
                value = value - c.cost
                state.put_bucket(c.key, value, ts, c.limit, c.rate)
            retry = 0 if ok else retry_after_us(c.cost, value, c.limit, c.rate)
            outcomes.append(Outcome(ok, math.floor(value), retry))
        else:
            used = int(value)
            if charge:
                used = used + c.cost
                state.windows[c.key] = (used, c.reset_us + 60_000_000)
            retry = 0 if ok else (-1 if c.cost > c.limit else c.reset_us - now_us)
            outcomes.append(Outcome(ok, c.limit - used, retry))
        if charge and c.settle and record is not None:
            expire, entries = state.records.get(record, (0, {}))
            if expire <= now_us:  # gone in Redis, with the trace it kept
                entries = {}
                state.traces.pop(record, None)
            entry = entries.setdefault(c.key, [0, 0, 0, 0.0, 0, 0])
            entry[0] += c.cost
            if c.kind == "b":
                entry[1], entry[2], entry[3] = 1, c.limit, c.rate
            else:
                entry[2] = c.limit
            if c.money:
                entry[4] = 1
            if c.shadow:
                entry[5] = 1
            state.records[record] = (now_us + ttl_ms * 1000, entries)
            if trace is not None:
                state.traces[record] = trace
    return ReserveResult(admitted, tuple(outcomes))


def settle(
    state: MemoryState, record: str, actual: int, now_us: int, actual_usd: int = 0
) -> SettleResult:
    item = state.records.pop(record, None)
    trace = state.traces.pop(record, None)
    if item is None or item[0] <= now_us:
        return SettleResult(False)
    reserved = 0
    for key, (charged, is_bucket, cap_f, rate, money, _) in item[1].items():
        if money:
            delta = actual_usd - int(charged)
        else:
            delta = actual - int(charged)
            reserved = max(reserved, int(charged))
        if is_bucket:
            cap = int(cap_f)
            tk, ts = refill(*state.bucket(key, cap, now_us), now_us, cap, rate)
            tk = tk - delta
            if tk > cap:
                tk = float(cap)
            state.put_bucket(key, tk, ts, cap, rate)
            continue
        used = state.window(key, now_us)
        if used is not None:
            used = used + delta
            if used < 0:
                used = 0
            state.windows[key] = (used, state.windows[key][1])
    return SettleResult(True, actual - reserved, trace)
