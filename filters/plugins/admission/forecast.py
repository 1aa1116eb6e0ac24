"""When a queued request will start, predicted from what holds the pool now. Pure.

A lane's measured grant rate lags: it is counted over a window, so at the start of a spike it
still says what the lane got before, and a lane held back by the lanes above it (strict
priority, their reserve: :mod:`filters.plugins.admission.demand`) still looks as if it drains. The
prediction here reads the state instead:

* ``room``: the slots the lane may hold in steady state, its share less what the lanes above
  hold or are measured to need. A lane with no room is blocked: nothing it queues starts until
  the lanes above ask for less (``inf``).
* A lane holding more than its room (a spike's first burst got in before the reserve was
  measured) starts nothing until its own requests have brought it back under its room.
* A lane under its room takes the next slots the pool frees (at the pool's completion rate);
  once at its room, it gets one slot per request of its own that ends: ``room / hold`` per
  second (Little's law).
* Tickets queued in the lanes above go first, at the pool's completion rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Outlook", "fade"]


@dataclass(frozen=True, slots=True)
class Outlook:
    """What decides how fast one lane's queue can start."""

    room: int  # slots the lane may hold in steady state
    running: int  # slots the lane holds now
    hold: float  # mean seconds a request of this lane holds its slot (> 0)
    pool_rate: float  # requests/s the pool completes, every lane (> 0)
    queued_above: int  # tickets waiting in the lanes above

    @property
    def rate(self) -> float:
        """Requests/s the lane starts in steady state (0: blocked by the lanes above)."""
        return self.room / self.hold

    def wait(self, ahead: int) -> float:
        """Seconds until a ticket with ``ahead`` tickets of its lane before it starts."""
        if self.room <= 0:
            return math.inf
        n = ahead + 1
        t = self.queued_above / self.pool_rate
        if self.running >= self.room:  # its own requests must end first, unreplaced
            over = self.running - self.room
            return t + over * self.hold / self.running + n * self.hold / self.room
        free = self.room - self.running  # taken as the pool frees slots
        first = min(n, free)
        return t + first / self.pool_rate + (n - first) * self.hold / self.room


def fade(window: float, want_above: float, free: int) -> float:
    """Seconds until the lanes above would want no more than ``free`` slots, if they stopped
    asking now: their measured demand falls as their requests leave its ``window``. The
    earliest a lane blocked by their reserve can start."""
    if want_above <= free:
        return 0.0
    return window * (1.0 - max(0, free) / want_above)
