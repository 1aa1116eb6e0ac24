"""The step guard (pure): how many batch streams a replica may carry beside interactive ones.

Every stream a replica decodes lengthens its decode step, and an interactive stream's time
between tokens (and the step its prefill waits behind) is that step. Priority scheduling
preempts batch for slots, not for step time: a fuller batch slows every interactive token.
The guard bounds what the batch adds: on each replica, the step with the batch beside the
interactive streams may be at most ``1 + max_increase`` times the step of the interactive
streams alone (``batch.runner.max_step_increase``).

**The replica's step, measured.** Each replica's ``/metrics`` counts its token gaps
(``sglang:inter_token_latency_seconds`` sum and count): a step of ``b`` decoding streams that
lasts ``s`` adds ``b`` gaps of ``s``. So between two reads ``Δt`` apart, the mean gap
``g = Δsum / Δcount`` is the step the streams saw, and ``b̄ = Δsum / Δt`` is how many streams
decoded on average (every second a stream decodes adds one second of gaps): both from the
same two counters, with no gauge read at another moment. The intervals are kept by load: the
last ``keep`` of each band of ``b̄`` (bands a quarter of a doubling wide), so hours at one
load (interactive busy, the batch capped) do not push out what was measured at another (the
last idle spell, the batch filling). Over them a line ``step(b) = a + c·b`` is fitted (least
squares, each interval weighted by its gaps); ``c`` is the time one more stream adds to
every step. A load seen again replaces its band's oldest intervals: the fit follows a replica
that got slower or faster at the loads it runs.

**On the safe side.** The slope used is the fit's upper bound, ``c + 2·se(c)`` (its standard
error from the intervals' scatter), never above the proportional bound ``Σ g / Σ b̄`` (a step
cannot cost less than nothing at zero streams: ``a ≥ 0`` means ``c ≤ g/b`` for every
interval). With too few intervals (fewer than three, or no spread in ``b̄``) the proportional
bound alone is used. So a replica whose step was never seen at two loads carries few batch
streams beside interactive ones; once it has been seen idle and busy, the fit decides.

**The arithmetic.** With ``i`` interactive streams on a replica (at least one when interactive
is active: an arriving request is a stream), the step they would see alone is
``s = max(a + c·i, c·i)``, and the batch may add ``n = ⌊max_increase · s / c⌋`` streams. A
replica with no measure yet gets ``⌊max_increase · i⌋`` (the proportional bound: steps as
long as their stream count). When no interactive stream is seen at all the guard does not
bind (the caller asks it only while interactive is active).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Quiet", "StepFit", "StepGuard", "StepReading"]

TAIL = math.log(20.0)  # a Poisson gap longer than TAIL/λ comes before 1 arrival in 20 (p95)
RATE_WINDOW_S = 60.0  # interactive arrivals are counted over this span
KEEP = 30  # intervals kept per band of load (15 s at the runner's 0.5 s reads)
BANDS_PER_DOUBLING = 4  # a band of b̄: [2^(k/4), 2^((k+1)/4)) streams
Z = 2.0  # standard errors above the fitted slope (the safe side)


@dataclass(frozen=True, slots=True)
class StepReading:
    """One read of a replica's ``/metrics``: its token-gap totals since it started."""

    gaps_s: float  # Σ inter-token gaps (seconds)
    gaps: float  # their count
    at: float  # when it was read (the reader's monotonic clock, seconds)


@dataclass(frozen=True, slots=True)
class _Interval:
    streams: float  # b̄: mean running streams
    step_s: float  # g: mean gap
    weight: float  # gaps in the interval


@dataclass(frozen=True, slots=True)
class StepFit:
    """``step(b) = intercept + slope·b`` as the guard uses it (``slope`` on the safe side)."""

    intercept: float
    slope: float
    intervals: int

    def step(self, streams: float) -> float:
        return max(self.intercept + self.slope * streams, self.slope * streams)


class StepGuard:
    """Per replica and band of load, the last ``keep`` intervals of measured steps;
    :meth:`cap` sums the batch streams every replica may carry."""

    def __init__(self, max_increase: float, *, keep: int = KEEP, z: float = Z) -> None:
        self.max_increase = max_increase
        self.keep = keep
        self.z = z
        self._last: dict[str, StepReading] = {}
        self._intervals: dict[str, dict[int, deque[_Interval]]] = {}

    def observe(self, endpoint: str, reading: StepReading) -> None:
        """One read of ``endpoint``; an interval with no token gaps (idle) adds nothing."""
        last = self._last.get(endpoint)
        self._last[endpoint] = reading
        if last is None or reading.gaps < last.gaps or reading.gaps_s < last.gaps_s:
            return  # first sight, or the replica restarted
        gaps = reading.gaps - last.gaps
        span = reading.at - last.at
        if gaps <= 0 or span <= 0:
            return
        gaps_s = reading.gaps_s - last.gaps_s
        streams = gaps_s / span  # streams decoding, on average over the interval
        step = gaps_s / gaps
        band = math.floor(math.log2(max(streams, 1.0)) * BANDS_PER_DOUBLING)
        bands = self._intervals.setdefault(endpoint, {})
        bands.setdefault(band, deque(maxlen=self.keep)).append(_Interval(streams, step, gaps))

    def forget(self, endpoints: Iterable[str]) -> None:
        """Keep only ``endpoints`` (a replica that left the pool takes its intervals along)."""
        keep = set(endpoints)
        for ep in set(self._last) - keep:
            del self._last[ep]
            self._intervals.pop(ep, None)

    def fit(self, endpoint: str) -> StepFit | None:
        """``endpoint``'s step line (slope on the safe side); None before any interval."""
        q = [iv for band in self._intervals.get(endpoint, {}).values() for iv in band]
        if not q:
            return None
        w = sum(iv.weight for iv in q)
        prop = sum(iv.weight * iv.step_s for iv in q) / sum(iv.weight * iv.streams for iv in q)
        n = len(q)
        mb = sum(iv.weight * iv.streams for iv in q) / w
        mg = sum(iv.weight * iv.step_s for iv in q) / w
        sbb = sum(iv.weight * (iv.streams - mb) ** 2 for iv in q) / w
        if n < 3 or sbb <= 1e-9:
            return StepFit(0.0, prop, n)
        sbg = sum(iv.weight * (iv.streams - mb) * (iv.step_s - mg) for iv in q) / w
        slope = sbg / sbb
        intercept = mg - slope * mb
        resid = sum(iv.weight * (iv.step_s - intercept - slope * iv.streams) ** 2 for iv in q) / w
        se = math.sqrt(resid * n / (n - 2) / (n * sbb))
        upper = min(max(slope + self.z * se, 0.0), prop)
        # the line through the intervals' centre with the safe slope
        return StepFit(mg - upper * mb, upper, n)

    def streams(self, endpoint: str, interactive: float) -> int:
        """Batch streams ``endpoint`` may carry beside ``interactive`` streams (at least one
        counted)."""
        i = max(interactive, 1.0)
        fit = self.fit(endpoint)
        if fit is None:
            return math.floor(self.max_increase * i)
        if fit.slope <= 0.0:
            return 2**31  # no measured cost per stream: the slots decide
        return math.floor(self.max_increase * fit.step(i) / fit.slope)

    def cap(self, endpoints: Iterable[str], interactive: float) -> int:
        """Batch streams the replicas ``endpoints`` may carry together, with ``interactive``
        streams over the pool spread evenly over them (the router's balance)."""
        eps = list(endpoints)
        if not eps:
            return 0
        each = interactive / len(eps)
        return min(sum(self.streams(ep, each) for ep in eps), 2**31)


class Quiet:
    """When the guard may let go: interactive has been idle long enough that the batch filling
    the slots will meet few interactive arrivals.

    A batch that fills the slots in a lull stays there for its lines' lifetime, and the next
    interactive requests meet its long steps: the guard's bound holds for them only if the
    lull is a real one. With interactive arrivals at rate ``λ`` (Poisson), a gap longer than
    ``ln 20 / λ`` precedes one arrival in 20; the guard lets go only after interactive has
    been idle that long (and at least ``trend``), so at most ~5% of interactive arrivals
    (the p95 the latency target is stated in) come after a lull long enough to find the
    batch unguarded. ``λ`` is counted over the last ``window`` seconds from the rises of
    the interactive count between samples (a lower bound: one that came and went between
    two samples is missed); none counted: ``trend`` alone."""

    def __init__(self, trend: float, *, window: float = RATE_WINDOW_S) -> None:
        self.trend = trend
        self.window = window
        self._rises: deque[tuple[float, int]] = deque()
        self._prev = 0
        self._seen_at = float("-inf")  # the last sample with interactive work
        self._start: float | None = None

    def observe(self, now: float, interactive: int) -> None:
        """One sample of the interactive requests at the replicas."""
        if self._start is None:
            self._start = now
        if interactive > self._prev:
            self._rises.append((now, interactive - self._prev))
        self._prev = interactive
        if interactive > 0:
            self._seen_at = now
        while self._rises and self._rises[0][0] < now - self.window:
            self._rises.popleft()

    def rate(self, now: float) -> float:
        """Interactive arrivals a second over the window (or since the first sample)."""
        if self._start is None:
            return 0.0
        span = min(self.window, now - self._start)
        return sum(n for _, n in self._rises) / span if span > 0 else 0.0

    def hold(self, now: float) -> float:
        """How long interactive must be idle before the guard lets go."""
        lam = self.rate(now)
        return max(self.trend, TAIL / lam) if lam > 0 else self.trend

    def quiet(self, now: float) -> bool:
        return now - self._seen_at >= self.hold(now)
