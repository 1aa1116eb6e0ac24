"""How many running slots a lane is measured to need: its offered rate times how long its
requests hold a slot (Little's law). Pure (``now`` passed in).

A lower lane that leaves room for the lanes above it (``LaneConfig.leave_for_higher``) does
not take the slots the higher lanes need in steady state: a batch stream cannot be preempted,
so a slot given to it while interactive arrivals need it turns into interactive waiting for the
whole length of that stream. Offered, not granted, requests are counted: a higher lane starved
by a lower one is granted little, but still asks.
"""

from __future__ import annotations

from filters.plugins.admission.drain import DrainMeter

__all__ = ["Demand"]

_WARMUP = 20  # hold-time samples averaged plainly before the moving average takes over
_ALPHA = 0.05  # weight of a new sample in the moving average afterwards
RECENT = 2.0  # seconds: the short window that sees a rising demand before the long one does


class Demand:
    """One lane's offered rate and mean hold time."""

    def __init__(self, window: float = 10.0) -> None:
        self.offered = DrainMeter(window)
        self.recent = DrainMeter(min(window, RECENT))
        self.hold: float | None = None  # mean seconds an admitted request holds its slot
        self._samples = 0

    def offer(self, now: float) -> None:
        self.offered.record(now)
        self.recent.record(now)

    def held(self, seconds: float) -> None:
        """An admitted request ended after holding its slot this long."""
        seconds = max(0.0, seconds)
        self._samples += 1
        if self.hold is None:
            self.hold = seconds
            return
        alpha = max(_ALPHA, 1.0 / min(self._samples, _WARMUP))
        self.hold += alpha * (seconds - self.hold)

    def slots(self, now: float) -> float:
        """Slots this lane is measured to keep busy (0 until both rate and hold are known)."""
        rate = self.offered.rate(now)
        if rate is None or self.hold is None:
            return 0.0
        return rate * self.hold

    def rising(self, now: float) -> float:
        """The slots it is about to be measured to need: :meth:`slots`, or more where the last
        ``RECENT`` seconds asked for more (the long window follows within its length)."""
        rate = max(self.offered.rate(now) or 0.0, self.recent.rate(now) or 0.0)
        return 0.0 if self.hold is None else rate * self.hold
