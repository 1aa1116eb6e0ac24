"""Pure: from each round's need to the desired count, with bounds, a GPU budget, cool-downs and
hysteresis (``now`` passed in).

- Bounds first: below ``min_replicas`` → ``min``; above the GPU budget → ``budget``; above
  ``max_replicas`` → ``max`` (the smaller of the two ceilings names the reason).
- Up: taken at once, unless the last increase is younger than ``scale_up_cooldown``.
- Down: to the largest need of the last ``scale_down_window`` (every round in it must have been
  that low), and no sooner than ``scale_down_cooldown`` after the last change of either sign.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from policy.autoscale import AutoscalePolicy

from .need import Need

__all__ = ["Decision", "Stabilizer", "bounded"]


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    reason: str  # why ``desired`` is this number: ttft, tbt, kv, slots, budget, min, max
    need: Need  # this round's raw need


def bounded(need: Need, policy: AutoscalePolicy) -> tuple[int, str]:
    """``need`` within the bounds and the GPU budget, and the reason of the result."""
    n, reason = need.replicas, need.reason
    budget = policy.budget_replicas
    ceiling, why = policy.max_replicas, "max"
    if budget is not None and budget < ceiling:
        ceiling, why = budget, "budget"
    if n > ceiling:
        return ceiling, why
    if n < policy.min_replicas or (n == policy.min_replicas and reason in ("idle", "infeasible")):
        return policy.min_replicas, "min"
    return n, reason


class Stabilizer:
    """One pool's desired count across rounds."""

    def __init__(self, policy: AutoscalePolicy, start: int) -> None:
        self.policy = policy
        self.desired, self.reason = start, "min" if start <= policy.min_replicas else "start"
        self._history: deque[tuple[float, int, str]] = deque()
        self._last_up = -float("inf")
        self._last_change = -float("inf")
        self._since: float | None = None  # first round seen

    def step(self, now: float, need: Need) -> Decision:
        p = self.policy
        if need.reason == "infeasible":  # the budgets cannot be met at all: hold, say why
            return Decision(self.desired, self.reason, need)
        n, reason = bounded(need, p)
        if self._since is None:
            self._since = now
        self._history.append((now, n, reason))
        while self._history and self._history[0][0] < now - p.scale_down_window:
            self._history.popleft()
        if n > self.desired:
            if now - self._last_up >= p.scale_up_cooldown:
                self.desired, self.reason = n, reason
                self._last_up = self._last_change = now
        elif n < self.desired:
            full = now - self._since >= p.scale_down_window
            if full and now - self._last_change >= p.scale_down_cooldown:
                top, why = max(((m, r) for _, m, r in self._history), key=lambda x: x[0])
                if top < self.desired:
                    self.desired, self.reason = top, why
                    self._last_change = now
        else:
            self.reason = reason
        # bounds may move under a reload: they hold whatever the history says
        if self.desired > p.max_replicas or (
            p.budget_replicas is not None and self.desired > p.budget_replicas
        ):
            self.desired, self.reason = bounded(Need(self.desired, self.reason), p)
        if self.desired < p.min_replicas:
            self.desired, self.reason = p.min_replicas, "min"
        return Decision(self.desired, self.reason, need)
