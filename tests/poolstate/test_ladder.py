"""The ladder's decision (poolstate/ladder.py): monotone, hysteresis, reversible."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.degradation import DegradationPolicy, LadderStep
from poolstate.ladder import LadderState, dwell, effect, next_state, retry_after

LEVEL = st.floats(min_value=0.0, max_value=2.5, allow_nan=False)


@st.composite
def policies(draw: st.DrawFn) -> DegradationPolicy:
    n = draw(st.integers(1, 4))
    enters = sorted(draw(st.lists(st.floats(0.1, 2.0), min_size=n, max_size=n, unique=True)))
    steps, low = [], 0.01
    for e in enters:
        leave = draw(st.floats(min_value=low, max_value=e))
        if leave >= e:
            leave = low
        low = max(low, leave)
        steps.append(LadderStep("shed", enter_at=e, leave_at=leave, lanes=("batch",)))
    return DegradationPolicy(steps=tuple(steps), min_dwell=draw(st.floats(0.0, 30.0)))


def _ladder() -> DegradationPolicy:
    return DegradationPolicy(
        steps=(
            LadderStep("clamp_max_tokens", 0.8, 0.6, tiers=("free", "batchy"), max_tokens=64),
            LadderStep("fallback", 1.0, 0.8, tiers=("free",)),
            LadderStep("shed", 1.5, 1.2, lanes=("batch",)),
        ),
        min_dwell=5.0,
    )


@settings(max_examples=150)
@given(policies(), st.integers(0, 4), st.floats(0, 100), st.floats(0, 100), LEVEL, LEVEL)
def test_monotone_in_saturation(
    p: DegradationPolicy, step: int, since: float, dt: float, a: float, b: float
) -> None:
    state = LadderState(min(step, len(p.steps)), since)
    lo, hi = sorted((a, b))
    assert next_state(p, state, lo, since + dt).step <= next_state(p, state, hi, since + dt).step


@settings(max_examples=100)
@given(policies(), st.data())
def test_no_flapping_inside_the_band(p: DegradationPolicy, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(p.steps)))
    low = p.steps[k - 1].leave_at if k > 0 else 0.0
    high = p.steps[k].enter_at if k < len(p.steps) else 2.5
    # noise anywhere in [leave_at of this step, enter_at of the next): the step holds
    noise = data.draw(
        st.lists(st.floats(low, high, exclude_max=True, allow_nan=False), min_size=1, max_size=50)
    )
    state, now = LadderState(k, 0.0), 0.0
    for s in noise:
        now += data.draw(st.floats(0.0, 100.0))
        state = next_state(p, state, s, now)
        assert state.step == k


@settings(max_examples=100)
@given(policies(), st.integers(0, 4), st.lists(LEVEL, max_size=20))
def test_reversible_steps_down_when_saturation_falls(
    p: DegradationPolicy, start: int, noise: list[float]
) -> None:
    state, now = LadderState(min(start, len(p.steps)), 0.0), 0.0
    for s in noise:
        now += 1.0
        state = next_state(p, state, s, now)
    for _ in range(len(p.steps) + 1):
        now += p.min_dwell + 1.0
        state = next_state(p, state, 0.0, now)
    assert state.step == 0
    # and back up at once when it rises again
    assert next_state(p, state, 2.5, now).step == len(p.steps)


@settings(max_examples=100)
@given(policies(), st.integers(1, 4), LEVEL, st.floats(0, 1))
def test_never_down_before_the_dwell(p: DegradationPolicy, k: int, s: float, frac: float) -> None:
    if p.min_dwell <= 0:
        p = DegradationPolicy(steps=p.steps, min_dwell=1.0)
    state = LadderState(min(k, len(p.steps)), 10.0)
    now = 10.0 + frac * p.min_dwell * 0.999
    assert next_state(p, state, s, now).step >= state.step


def test_enter_leave_and_dwell_by_example() -> None:
    p = _ladder()
    s = next_state(p, LadderState(), 0.9, 0.0)
    assert s == LadderState(1, 0.0)
    s = next_state(p, s, 1.6, 1.0)
    assert s == LadderState(3, 1.0)  # straight up to the highest step reached
    assert next_state(p, s, 1.3, 2.0) == s  # inside the band
    assert next_state(p, s, 0.7, 5.9) == s  # below, but not dwelt 5 s
    assert next_state(p, s, 0.7, 6.0) == LadderState(1, 6.0)  # down to the clamp (leave 0.6)
    assert next_state(p, LadderState(1, 6.0), None, 11.0) == LadderState(0, 11.0)  # no data


def test_effect_is_cumulative_and_by_tier_or_lane() -> None:
    p = _ladder()
    assert effect(p, 0, "free", "batch").actions == ()
    assert effect(p, 1, "free", "interactive").max_tokens == 64
    assert effect(p, 1, "pro", "interactive").actions == ()
    e = effect(p, 3, "free", "batch")
    assert (e.max_tokens, e.fallback, e.shed) == (64, True, True)
    assert effect(p, 3, "pro", "batch").actions == ("shed",)
    assert effect(p, 3, "pro", "interactive").actions == ()
    assert effect(p, 2, "batchy", "interactive").actions == ("clamp_max_tokens",)


def test_retry_after_is_the_remaining_dwell() -> None:
    p = _ladder()
    assert retry_after(p, LadderState(3, 100.0), 101.0) == 4.0
    assert retry_after(p, LadderState(3, 100.0), 200.0) == 1.0


def test_a_measured_shed_step_is_left_after_settle_not_the_dwell() -> None:
    """Where the level counts what the shed step refuses, the shed step is left as soon as that
    demand fits (after ``settle``); the steps below keep their dwell, and inside the band the
    step holds as before."""
    p = _ladder()
    s = next_state(p, LadderState(), 1.6, 0.0, settle=1.0)
    assert s == LadderState(3, 0.0)
    assert next_state(p, s, 0.3, 0.9, settle=1.0) == s  # still measuring
    assert next_state(p, s, 1.3, 4.0, settle=1.0) == s  # in the band: holds (no flapping)
    down = next_state(p, s, 0.7, 1.0, settle=1.0)
    assert down == LadderState(1, 1.0)  # not 5 s: the refused demand was measured to fit
    assert next_state(p, down, 0.1, 5.9, settle=1.0) == down  # the clamp keeps its dwell
    assert next_state(p, down, 0.1, 6.0, settle=1.0) == LadderState(0, 6.0)
    assert next_state(p, s, 0.7, 1.0) == s  # without settle: the blind dwell
    assert dwell(p, 3, 1.0) == 1.0 and dwell(p, 2, 1.0) == 5.0 and dwell(p, 3) == 5.0
    assert retry_after(p, LadderState(3, 100.0), 100.2, 1.0) == 1.0


@settings(max_examples=100)
@given(policies(), st.integers(0, 4), st.floats(0, 100), st.floats(0, 100), LEVEL, LEVEL,
       st.floats(0, 5))  # fmt: skip
def test_settle_keeps_the_ladder_monotone_and_never_longer(
    p: DegradationPolicy, step: int, since: float, dt: float, a: float, b: float, settle: float
) -> None:
    state = LadderState(min(step, len(p.steps)), since)
    lo, hi = sorted((a, b))
    now = since + dt
    assert (
        next_state(p, state, lo, now, settle=settle).step
        <= next_state(p, state, hi, now, settle=settle).step
    )
    # settle only lets a step go sooner, never later nor elsewhere than the dwell would
    slow = next_state(p, state, lo, now).step
    fast = next_state(p, state, lo, now, settle=settle).step
    assert fast <= slow
    assert fast in (slow, next_state(p, state, lo, now + p.min_dwell + 1.0).step)


@settings(max_examples=100)
@given(policies(), st.data())
def test_no_flapping_inside_the_band_with_settle(p: DegradationPolicy, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(p.steps)))
    low = p.steps[k - 1].leave_at if k > 0 else 0.0
    high = p.steps[k].enter_at if k < len(p.steps) else 2.5
    noise = data.draw(
        st.lists(st.floats(low, high, exclude_max=True, allow_nan=False), min_size=1, max_size=50)
    )
    state, now = LadderState(k, 0.0), 0.0
    for s in noise:
        now += data.draw(st.floats(0.0, 100.0))
        state = next_state(p, state, s, now, settle=0.0)
        assert state.step == k


def test_expected_demand_holds_a_step_but_takes_none() -> None:
    """Clients back when told (``expected``) count against ``leave_at`` but not ``enter_at``."""
    p = _ladder()
    assert next_state(p, LadderState(), 1.6, 0.0, expected=0.5) == LadderState(2, 0.0)
    assert next_state(p, LadderState(), 1.6, 0.0, expected=0.0) == LadderState(3, 0.0)
    on = LadderState(3, 0.0)
    assert next_state(p, on, 1.3, 10.0, settle=1.0, expected=1.3) == on  # holds the shed step
    assert next_state(p, on, 1.0, 10.0, settle=1.0, expected=1.0).step == 2
    assert next_state(p, LadderState(), float("inf"), 0.0, expected=5.0).step == 3


@settings(max_examples=100)
@given(policies(), st.integers(0, 4), st.floats(0, 50), LEVEL, st.floats(0, 2.5))
def test_expected_never_raises_the_step(
    p: DegradationPolicy, step: int, dt: float, s: float, e: float
) -> None:
    state = LadderState(min(step, len(p.steps)), 0.0)
    assert next_state(p, state, s, dt, expected=e).step <= next_state(p, state, s, dt).step
