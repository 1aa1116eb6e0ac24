"""A measured rate: events per second over a sliding window. Pure (``now`` passed in)."""

from __future__ import annotations

from collections import deque

__all__ = ["DrainMeter"]


class DrainMeter:
    """Counts events in the last ``window`` seconds (at most ``cap`` kept)."""

    def __init__(self, window: float = 10.0, cap: int = 4096) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        self._events: deque[float] = deque(maxlen=cap)
        self._first: float | None = None

    def record(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._events.append(now)

    def rate(self, now: float) -> float | None:
        """Events per second over the window (or since the first event, when that is more
        recent); None while fewer than two events are in the window."""
        ev = self._events
        cutoff = now - self.window
        while ev and ev[0] < cutoff:
            ev.popleft()
        if self._first is None or len(ev) < 2:
            return None
        span = min(self.window, now - self._first)
        if len(ev) == ev.maxlen:  # the cap dropped older events: measure over those kept
            span = min(span, now - ev[0])
        if span <= 0:
            return None
        return len(ev) / span
