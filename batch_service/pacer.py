"""How many batch lines may be in flight now (pure; the clock is passed in).

The window is the room interactive traffic leaves in the pool: ``fill`` of its running slots
(the capacity the replicas report) minus what runs there that is not ours, bounded by an
additive-increase / multiplicative-decrease limit that the gateway's own answers drive: a line
shed by admission or quota (429, 503) halves the limit and pauses new lines for ``backoff``;
each answered line raises it by one. While the pool state is stale (the control plane is not
heard), the reader reports every replica saturated, so nothing new starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Pacer", "PoolView"]


@dataclass(frozen=True, slots=True)
class PoolView:
    capacity: int  # running slots of the pool's fresh replicas (0: unknown)
    running: int  # requests running there now, ours included
    saturation: float  # the pool's mean saturation (1 = every slot busy; stale = saturated)


class Pacer:
    def __init__(self, max_concurrency: int, fill: float, backoff: float) -> None:
        self.max = max_concurrency
        self.fill = fill
        self.backoff = backoff
        self.limit = float(max(1, max_concurrency // 4))  # the AIMD limit; starts modest
        self.paused_until = 0.0

    def window(self, pool: PoolView | None, ours: int, now: float) -> int:
        """Lines that may be in flight at ``now`` with ``ours`` in flight (``pool`` None:
        no pool state at all yet: nothing)."""
        if now < self.paused_until or pool is None:
            return 0
        if pool.capacity <= 0:  # stale or unknown replicas: the reader marks them saturated
            return 0 if pool.saturation >= 1.0 else min(int(self.limit), self.max)
        others = max(0, pool.running - ours)
        room = math.floor(self.fill * pool.capacity) - others
        return max(0, min(room, int(self.limit), self.max))

    def answered(self) -> None:
        self.limit = min(float(self.max), self.limit + 1.0)

    def shed(self, now: float, retry_after: float | None = None) -> None:
        self.limit = max(1.0, self.limit / 2.0)
        pause = self.backoff if retry_after is None else max(self.backoff, retry_after)
        self.paused_until = max(self.paused_until, now + pause)
