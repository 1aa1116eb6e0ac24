"""The clients already told when to come back, per lane: each shed client is told a later time
than the ones told before it, so a burst of shed clients does not come back as one herd. Pure
(``now`` passed in)."""

from __future__ import annotations

import heapq

__all__ = ["Promises"]


class Promises:
    """Return times promised (through ``Retry-After``) that have not come yet (at most ``cap``
    kept: past it the earliest are forgotten, which only shortens later answers)."""

    def __init__(self, cap: int = 65_536) -> None:
        self.cap = cap
        self._times: list[float] = []

    def outstanding(self, now: float) -> int:
        """Clients told to come back after ``now``."""
        t = self._times
        while t and t[0] <= now:
            heapq.heappop(t)
        return len(t)

    def add(self, at: float) -> None:
        heapq.heappush(self._times, at)
        if len(self._times) > self.cap:
            heapq.heappop(self._times)
