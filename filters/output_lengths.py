"""Output lengths learned online from settled usage: a high quantile per tenant and model.

One model, read by every reservation of the filter server (DESIGN.md, "third wave"): each
settled answer's completion tokens are added to a histogram of its (tenant, model) and to the
pooled histogram of its model (every tenant: the prior of a tenant with too little history).

**Histogram.** Exact counts for lengths below 16, then buckets growing by 2^(1/8) (about 9%):
147 counters reach past 1,000,000 tokens (``MAX_TOKENS_LIMIT``). A quantile answers the upper
edge of its bucket, so it is never below the sample quantile and at most ~9% above it.

**Freshness: one rule.** Each key keeps two windows of ``window`` seconds, the current and the
previous one; a quantile reads both (the answers of the last one to two windows). A window
older than that is forgotten, so a tenant whose answers grew longer is reserved for within two
windows, and one that stopped sending falls back to the pool's lengths.

**Several filter processes** share one set of histograms through Redis
(:class:`filters.output_lengths_shared.SharedLengths`, attached with :meth:`OutputLengths.share`):
each process adds its answers there in the background and re-reads the histograms its
reservations use every ``refresh`` seconds, so every process reserves from every process's
answers (the freshness rule becomes: the last one to two windows, as of at most ``refresh`` ago).
Windows are numbered from the wall clock, the same in every process.

**Memory.** At most ``max_keys`` keys; a new key past that clears the table (the pooled
histograms fill again within a window; until then reservations are ``max_tokens``, the safe
side).

Answers the in-stream stop or a ``max_tokens`` cut short count at the length they reached: a
lower bound of what was asked for, which a high quantile of mostly uncut answers absorbs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["BUCKETS", "Histogram", "Key", "OutputLengths", "Sharing", "bucket_of", "upper_edge"]

_EXACT = 16  # lengths below this have a bucket each
_STEPS = 8  # buckets per doubling above it
BUCKETS = _EXACT + _STEPS * 17  # 16 * 2**17 > 2 million tokens


def bucket_of(tokens: int) -> int:
    """The bucket of an answer of ``tokens`` completion tokens."""
    if tokens < _EXACT:
        return max(0, tokens)
    i = _EXACT + int(_STEPS * math.log2(tokens / _EXACT))
    # float rounding must not put a length past its bucket's upper edge
    while i > _EXACT and upper_edge(i - 1) >= tokens:
        i -= 1
    while upper_edge(i) < tokens:
        i += 1
    return min(i, BUCKETS - 1)


def upper_edge(bucket: int) -> int:
    """The largest length bucket ``bucket`` holds."""
    if bucket < _EXACT:
        return bucket
    return math.ceil(_EXACT * 2 ** ((bucket - _EXACT + 1) / _STEPS)) - 1


@dataclass(slots=True)
class Histogram:
    """Counts per bucket over the current and the previous window (``period`` = current)."""

    period: int
    current: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    previous: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    n_current: int = 0
    n_previous: int = 0

    def roll(self, period: int) -> None:
        """Move to window ``period`` (forgets what is two windows old or more)."""
        if period == self.period:
            return
        if period == self.period + 1:
            self.previous, self.n_previous = self.current, self.n_current
        else:
            self.previous, self.n_previous = [0] * BUCKETS, 0
        self.current, self.n_current = [0] * BUCKETS, 0
        self.period = period

    def add(self, tokens: int) -> None:
        self.current[bucket_of(tokens)] += 1
        self.n_current += 1

    @property
    def count(self) -> int:
        return self.n_current + self.n_previous

    def quantile(self, q: float) -> int:
        """The upper edge of the bucket holding the ``q`` quantile (rank ``ceil(q * n)``)."""
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i in range(BUCKETS):
            seen += self.current[i] + self.previous[i]
            if seen >= rank:
                return upper_edge(i)
        return upper_edge(BUCKETS - 1)


Key = tuple[str | None, str]  # (tenant, model); tenant None: the model's pooled lengths


class Sharing(Protocol):
    """Where the answers of every filter process meet (:mod:`filters.output_lengths_shared`)."""

    def added(self, key: Key, period: int, bucket: int) -> None:
        """One answer of ``bucket`` went into ``key``'s window ``period`` here."""
        ...

    def wanted(self, key: Key) -> None:
        """A reservation read ``key``: keep it fresh."""
        ...


class OutputLengths:
    """Completion-token quantiles per (tenant, model), with the model's pooled lengths as the
    prior. ``clock`` gives seconds; ``window`` may change with the policy (:meth:`configure`)."""

    def __init__(
        self, *, clock: Callable[[], float], window: float = 600.0, max_keys: int = 100_000
    ) -> None:
        self._clock = clock
        self._window = window
        self._max = max_keys
        self._table: dict[Key, Histogram] = {}
        self._sharing: Sharing | None = None

    def share(self, sharing: Sharing | None) -> None:
        """Add answers to, and take histograms from, ``sharing`` (None: this process alone)."""
        self._sharing = sharing

    @property
    def window(self) -> float:
        return self._window

    def replace(self, key: Key, current: list[int], previous: list[int], period: int) -> None:
        """``key``'s histogram as every process's answers make it (read from the shared store
        for window ``period``); answers added here since that read arrive with the next one."""
        if period != self._period():
            return  # read across a window's end: the next read is right
        h = self._table.get(key)
        if h is None:
            if len(self._table) >= self._max:
                self._table.clear()
            h = self._table[key] = Histogram(period)
        h.period, h.current, h.previous = period, current, previous
        h.n_current, h.n_previous = sum(current), sum(previous)

    def configure(self, window: float) -> None:
        if window != self._window:  # windows of another length do not line up: start again
            self._window = window
            self._table.clear()

    def period(self) -> int:
        """The current window's number (wall-clock seconds // window)."""
        return self._period()

    def _period(self) -> int:
        return int(self._clock() // self._window)

    def observe(self, tenant: str, model: str, tokens: int) -> None:
        """One settled answer of ``tokens`` completion tokens."""
        period = self._period()
        for key in ((tenant, model), (None, model)):
            h = self._table.get(key)
            if h is None:
                if len(self._table) >= self._max:
                    self._table.clear()
                h = self._table[key] = Histogram(period)
            h.roll(period)
            h.add(tokens)
            if self._sharing is not None:
                self._sharing.added(key, period, bucket_of(tokens))

    def quantile(self, tenant: str, model: str, q: float, min_samples: int) -> tuple[int, str]:
        """``(tokens, source)``: the tenant's ``q`` quantile (source ``tenant``), else the
        model's pooled one (``pooled``), each from at least ``min_samples`` answers; else
        ``(0, "none")``."""
        period = self._period()
        for key, source in (((tenant, model), "tenant"), ((None, model), "pooled")):
            if self._sharing is not None:
                self._sharing.wanted(key)
            h = self._table.get(key)
            if h is None:
                continue
            h.roll(period)
            if h.count >= min_samples:
                return h.quantile(q), source
        return 0, "none"
