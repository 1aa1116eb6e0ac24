"""Policy of the degradation ladder: per pool, ordered steps a saturated pool takes for its
lower tiers (filters/plugins/degrade, docs/policy.md "Degradation ladder").

Each step is entered when the pool's saturation reaches ``enter_at`` and left only once it is
below ``leave_at`` and the ladder has stayed on its step for ``min_dwell`` (hysteresis). Steps
are cumulative: on step 3 the clamp of step 1 and the fallback of step 2 still apply to the
requests they name. A step names the requests it applies to by tier, by lane, or both (a
request matching either is affected).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from policy.common import Lane, Positive
from policy.decode import Duration, Range

__all__ = ["ACTIONS", "DegradationPolicy", "LadderStep"]

Action = Literal["clamp_max_tokens", "fallback", "shed"]
ACTIONS: tuple[str, ...] = ("clamp_max_tokens", "fallback", "shed")
Level = Annotated[float, Range(0.01, 2.0)]  # leave_at 0 would never be left


@dataclass(frozen=True)
class LadderStep:
    """One rung: ``clamp_max_tokens`` (to ``max_tokens``), ``fallback`` (to the pool's
    ``fallback`` pool and its first model) or ``shed`` (503 with Retry-After)."""

    action: Action
    enter_at: Level
    leave_at: Level
    tiers: tuple[str, ...] = ()
    lanes: tuple[Lane, ...] = ()
    max_tokens: Positive | None = None

    def __post_init__(self) -> None:
        if self.leave_at >= self.enter_at:
            raise ValueError("leave_at must be below enter_at (hysteresis)")
        if not self.tiers and not self.lanes:
            raise ValueError("name the requests this step affects: tiers, lanes or both")
        if self.action == "clamp_max_tokens" and self.max_tokens is None:
            raise ValueError("a clamp_max_tokens step needs max_tokens")
        if self.action != "clamp_max_tokens" and self.max_tokens is not None:
            raise ValueError("max_tokens belongs to a clamp_max_tokens step only")

    def affects(self, tier: str | None, lane: str | None) -> bool:
        return (tier is not None and tier in self.tiers) or (
            lane is not None and lane in self.lanes
        )


@dataclass(frozen=True)
class DegradationPolicy:
    """The steps in the order they are taken (``enter_at`` rising, ``leave_at`` not falling)."""

    steps: tuple[LadderStep, ...] = ()
    min_dwell: Annotated[float, Duration(0, 3600)] = 5.0

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("steps: give at least one step")
        for i in range(1, len(self.steps)):
            lo, hi = self.steps[i - 1], self.steps[i]
            if hi.enter_at <= lo.enter_at:
                raise ValueError(
                    f"steps[{i}].enter_at must be above steps[{i - 1}].enter_at "
                    "(steps are taken in order)"
                )
            if hi.leave_at < lo.leave_at:
                raise ValueError(f"steps[{i}].leave_at must not be below steps[{i - 1}].leave_at")
