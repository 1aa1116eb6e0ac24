"""The degradation ladder's decision, pure: pool saturation + current step + time → next step.

Step 0 is normal service; on step ``k`` the first ``k`` steps of the pool's
:class:`~policy.degradation.DegradationPolicy` apply (cumulatively).

* Up: at once, to the highest step whose ``enter_at`` the saturation reaches.
* Down: only when the saturation is below the current step's ``leave_at`` and the ladder has
  stayed on its step for ``min_dwell``; then to the highest step whose ``leave_at`` it still
  reaches. Between ``leave_at`` and the next ``enter_at`` nothing changes (hysteresis).
* No data (``None``: the control plane is silent) reads as 0: the ladder steps down, and the
  admission capacity in the policy remains the safe bound (as in filters/plugins/admission/signal.py).
* A shed step hides the demand it refuses from a reading of what is admitted, so ``min_dwell``
  holds it however quiet the pool turns (the dwell is what keeps it from flapping). Where the
  reading counts what the shed step turned away (the caller says so with ``settle``: the
  filter server's gate counts the fresh requests it refused, :mod:`filters.plugins.degrade`), the shed
  step is left as soon as that demand fits, after ``settle`` seconds of measuring it: the same
  demand that let it down is then admitted, and it returns only past ``enter_at``.
* Clients that come back when a ``Retry-After`` told them are demand, not a new spike: the
  caller passes their part of the level as ``expected``; it holds the current step (it counts
  against ``leave_at``) but does not take a higher one (it is left out against ``enter_at``).

The next step never decreases as saturation increases (same step and time), and every change
restarts the dwell clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policy.degradation import DegradationPolicy

__all__ = ["Effect", "LadderState", "dwell", "effect", "next_state", "retry_after"]


@dataclass(frozen=True, slots=True)
class LadderState:
    step: int = 0  # 0 = normal service
    since: float = 0.0  # when the ladder came to this step (the caller's clock)


@dataclass(frozen=True, slots=True)
class Effect:
    """What the active steps do to one request (tier and lane)."""

    step: int = 0
    max_tokens: int | None = None  # the lowest cap of the clamp steps that apply
    fallback: bool = False
    shed: bool = False

    @property
    def actions(self) -> tuple[str, ...]:
        out = []
        if self.max_tokens is not None:
            out.append("clamp_max_tokens")
        if self.fallback:
            out.append("fallback")
        if self.shed:
            out.append("shed")
        return tuple(out)


def _level(saturation: float | None) -> float:
    if saturation is None:
        return 0.0
    return saturation if math.isfinite(saturation) else math.inf


def dwell(policy: DegradationPolicy, step: int, settle: float | None = None) -> float:
    """Seconds the ladder stays on ``step`` at least: ``min_dwell``, or ``settle`` (when
    shorter) on a shed step whose refused demand the level counts."""
    shed = 0 < step <= len(policy.steps) and policy.steps[step - 1].action == "shed"
    if settle is not None and shed:
        return min(policy.min_dwell, max(0.0, settle))
    return policy.min_dwell


def next_state(
    policy: DegradationPolicy,
    state: LadderState,
    saturation: float | None,
    now: float,
    *,
    settle: float | None = None,
    expected: float = 0.0,
) -> LadderState:
    """The step after ``state`` at level ``saturation``; ``settle``: the level counts the demand
    a shed step refuses, which may then be left after ``settle`` seconds; ``expected``: the
    part of the level that was planned (clients back when a ``Retry-After`` told them), which
    holds a step but does not take one (module docstring)."""
    s = _level(saturation)
    steps = policy.steps
    current = min(state.step, len(steps))
    rise = s - max(0.0, expected) if math.isfinite(s) else s
    up = sum(1 for st in steps if rise >= st.enter_at)
    if up > current:
        return LadderState(up, now)
    dwelt = now - state.since >= dwell(policy, current, settle)
    if current > 0 and s < steps[current - 1].leave_at and dwelt:
        down = sum(1 for st in steps[:current] if s >= st.leave_at)
        return LadderState(down, now)
    return state if current == state.step else LadderState(current, state.since)


def effect(policy: DegradationPolicy, step: int, tier: str | None, lane: str | None) -> Effect:
    """The cumulative effect of steps ``1..step`` on a request of ``tier`` in ``lane``."""
    cap: int | None = None
    fallback = shed = False
    for st in policy.steps[:step]:
        if not st.affects(tier, lane):
            continue
        if st.action == "clamp_max_tokens" and st.max_tokens is not None:
            cap = st.max_tokens if cap is None else min(cap, st.max_tokens)
        elif st.action == "fallback":
            fallback = True
        elif st.action == "shed":
            shed = True
    return Effect(step, cap, fallback, shed)


def retry_after(
    policy: DegradationPolicy, state: LadderState, now: float, settle: float | None = None
) -> float:
    """Seconds until the ladder could step down at the earliest (its remaining dwell), ≥ 1."""
    return max(1.0, state.since + dwell(policy, state.step, settle) - now)
