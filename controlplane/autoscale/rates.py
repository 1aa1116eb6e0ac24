"""Pure: each replica's measured decode and prefill speed, from its SGLang histograms.

The planner's replica model (a backend profile, folded at the pool's workload) says how long a
decode step of ``b`` streams takes (``itl(b)``) and how fast a prompt is prefilled. A replica
may run slower or faster than that (another GPU, clocks, a noisy neighbour, the emulator's
``--time-scale``). Per replica, two factors scale the model: ``decode`` multiplies every step
time ``itl(b)``, ``prefill`` divides the prefill rate (2.0: twice the profile's time, half its
rate). They come from what the replica's ``/metrics`` already counts, per scrape interval:

- **Token gaps** (``inter_token_latency_seconds`` sum and count): a step of ``b`` decoding
  streams adds ``b`` gaps of its full duration, and a step that also prefills stalls them all,
  so ``Σ gaps = decode · count · itl(b̄) + prefill · b̄ · P`` with ``b̄`` the running requests
  (mean of the two scrapes) and ``P`` the profile's time for the uncached prompt tokens admitted
  in the interval (``Δprompt − Δcached`` over the profile's prefill rate).
- **First tokens** (``time_to_first_token`` minus ``queue_time``: the interval's mean TTFT
  minus its mean queue time, per first token): from admission to the first token a request
  waits out the step that prefills it, shared with the prompts admitted beside it (λ·d of
  them, λ the first tokens per second, d the mean gap), so
  ``Σ (ttft − queue) = decode · first · itl(b̄) + prefill · P · (1 + λ·d)``.

Summed over the last ``keep`` intervals that had traffic (idle intervals add nothing, so an
idle replica keeps its last figures), the two equations give the two factors. Where they are
nearly proportional (a mix the two cannot tell apart: short prompts, say) or give a
non-positive factor, one factor for both is taken from the token gaps alone. Until a replica has
``min_gaps`` token gaps and ``min_first`` first tokens in its window, its source is
``profile`` and the caller uses the profile (times its time scale).

Biases, all on the safe side (they overstate the time, so the planner asks for more): prompts
prefilled together in one step each see the whole step in their TTFT (bursts raise
``prefill``); the running-request gauge counts requests still in prefill in ``b̄``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.planner import ReplicaModel
from poolstate.counters import ReplicaCounters

__all__ = ["MEASURED", "PROFILE", "RateEstimator", "Speed", "pool_speed"]

MEASURED = "measured"
PROFILE = "profile"
_LIMITS = (0.02, 50.0)  # a factor outside this is a broken page, not a replica
_PROPORTIONAL = 0.8  # the equations are this close to proportional: one factor for both


@dataclass(frozen=True, slots=True)
class Speed:
    """A replica's step times over the profile's: ``decode`` for ``itl(b)``, ``prefill`` for
    prefill time (1.0 = as the profile), where they come from, and the samples behind them."""

    decode: float
    prefill: float
    source: str
    gaps: float = 0.0
    first: float = 0.0


@dataclass(frozen=True, slots=True)
class _Interval:
    gaps_s: float  # Σ token gaps
    gaps_decode: float  # count · itl(b̄) of the profile
    gaps_prefill: float  # b̄ · P
    first_s: float  # Σ (ttft − queue)
    first_decode: float  # first · itl(b̄)
    first_prefill: float  # P
    gaps: float
    first: float


def _itl(model: ReplicaModel, batch: float) -> float:
    """The profile's ``itl`` at a fractional batch, linear between the integers around it."""
    lo = max(1, min(math.floor(batch), model.max_running_requests))
    hi = min(lo + 1, model.max_running_requests)
    frac = min(max(batch - lo, 0.0), 1.0) if hi > lo else 0.0
    return model.itl_s(lo) * (1 - frac) + model.itl_s(hi) * frac


class RateEstimator:
    """Per replica, the last ``keep`` intervals with traffic; :meth:`speed` solves them."""

    def __init__(self, *, min_gaps: float = 200.0, min_first: float = 10.0, keep: int = 60) -> None:
        self.min_gaps = min_gaps
        self.min_first = min_first
        self.keep = keep
        self._last: dict[str, tuple[float, ReplicaCounters]] = {}
        self._intervals: dict[str, deque[_Interval]] = {}

    def observe(self, endpoint: str, cur: ReplicaCounters, model: ReplicaModel, now: float) -> None:
        """One scrape of ``endpoint`` read at ``now``; ``model`` is the profile at the pool's
        workload now (unscaled: the factors are relative to it)."""
        last = self._last.get(endpoint)
        if last is not None and last[1] == cur:
            return  # the same page again (planned more often than scraped)
        self._last[endpoint] = (now, cur)
        if last is None:
            return
        then, prev = last
        if cur.itl_count < prev.itl_count or cur.ttft_count < prev.ttft_count:
            return  # first sight, or the replica restarted: no interval
        gaps = cur.itl_count - prev.itl_count
        first = cur.ttft_count - prev.ttft_count
        if gaps <= 0 and first <= 0:
            return  # idle (or the same page again): keep what was measured
        batch = max((cur.running + prev.running) / 2, 1.0)
        itl = _itl(model, batch)
        uncached = max((cur.prompt - prev.prompt) - (cur.cached - prev.cached), 0.0)
        p = uncached / model.prefill_tok_s
        admitted = cur.queue_count - prev.queue_count
        if first > 0 and admitted > 0:
            # per request: the mean TTFT of the first tokens minus the mean queue time of the
            # admissions of the same interval (a sum of each would count, at the window's
            # edges, queue times whose first token is outside it: seconds each in a backlog)
            ttft = (cur.ttft_sum - prev.ttft_sum) / first
            first_s = first * (ttft - (cur.queue_sum - prev.queue_sum) / admitted)
        else:
            first = 0.0  # no pair to read a prefill from in this interval
            first_s = 0.0
        gaps_s = max(cur.itl_sum - prev.itl_sum, 0.0)
        # a request admitted with others waits for their prefills too: with arrivals at rate
        # λ, one step of d seconds gathers λ·d of them besides itself (d: the mean gap)
        step = gaps_s / gaps if gaps > 0 else itl
        span = now - then
        shared = 1.0 + (first / span * step if span > 0 else 0.0)
        iv = _Interval(
            gaps_s=gaps_s, gaps_decode=gaps * itl, gaps_prefill=batch * p,
            first_s=max(first_s, 0.0), first_decode=first * itl, first_prefill=p * shared,
            gaps=gaps, first=first,
        )  # fmt: skip
        q = self._intervals.setdefault(endpoint, deque(maxlen=self.keep))
        q.append(iv)

    def forget(self, endpoints: Iterable[str]) -> None:
        """Keep only ``endpoints`` (a replica that left the pool takes its figures along)."""
        keep = set(endpoints)
        for ep in set(self._last) - keep:
            del self._last[ep]
            self._intervals.pop(ep, None)

    def speed(self, endpoint: str, fallback: float = 1.0) -> Speed:
        """``endpoint``'s factors, or ``fallback`` for both (source ``profile``) until it has
        enough samples."""
        q = self._intervals.get(endpoint, ())
        gaps = sum(iv.gaps for iv in q)
        first = sum(iv.first for iv in q)
        if gaps < self.min_gaps or first < self.min_first:
            return Speed(fallback, fallback, PROFILE, gaps, first)
        y1 = sum(iv.gaps_s for iv in q)
        a1 = sum(iv.gaps_decode for iv in q)
        b1 = sum(iv.gaps_prefill for iv in q)
        y2 = sum(iv.first_s for iv in q)
        a2 = sum(iv.first_decode for iv in q)
        b2 = sum(iv.first_prefill for iv in q)
        decode, prefill = _solve(y1, a1, b1, y2, a2, b2)
        if not (math.isfinite(decode) and math.isfinite(prefill)):
            return Speed(fallback, fallback, PROFILE, gaps, first)
        lo, hi = _LIMITS
        return Speed(min(max(decode, lo), hi), min(max(prefill, lo), hi), MEASURED, gaps, first)


def _solve(y1: float, a1: float, b1: float, y2: float, a2: float, b2: float) -> tuple[float, float]:
    """``y1 = d·a1 + p·b1``, ``y2 = d·a2 + p·b2`` for (d, p); where the two are nearly
    proportional or a factor comes out non-positive, one factor for both from the token gaps
    alone (the most samples, and no queue time subtracted)."""
    one = y1 / (a1 + b1) if a1 + b1 > 0 else math.nan
    det = a1 * b2 - a2 * b1
    if a1 * b2 <= 0 or abs(det) < (1 - _PROPORTIONAL) * a1 * b2:
        return one, one
    d = (y1 * b2 - y2 * b1) / det
    p = (a1 * y2 - a2 * y1) / det
    if d <= 0 or p <= 0:
        return one, one
    return d, p


def pool_speed(speeds: Iterable[Speed], fallback: float = 1.0) -> tuple[float, float, str]:
    """The factors of the pool's average replica: capacity adds up, so the harmonic mean over
    the replicas (a replica not measured yet counts at ``fallback``), and ``measured`` when at
    least one replica's figures are measured."""
    inv_d = inv_p = 0.0
    n = 0
    measured = False
    for s in speeds:
        inv_d += 1.0 / s.decode
        inv_p += 1.0 / s.prefill
        n += 1
        measured = measured or s.source == MEASURED
    if n == 0:
        return fallback, fallback, PROFILE
    return n / inv_d, n / inv_p, MEASURED if measured else PROFILE
