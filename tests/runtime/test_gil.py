"""runtime.gil: one process-wide count for the lowered switch interval."""

from __future__ import annotations

import sys

import pytest

from runtime.gil import SwitchInterval


def test_overlapping_holders_keep_the_lowest_and_restore_the_first_value() -> None:
    before = sys.getswitchinterval()
    a, b = SwitchInterval(0.001), SwitchInterval(0.0002)
    a.__enter__()
    assert sys.getswitchinterval() == pytest.approx(0.001)
    b.__enter__()
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    a.__exit__(None, None, None)  # the first out is not the last: b's stays
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    b.__exit__(None, None, None)
    assert sys.getswitchinterval() == before


def test_a_holder_never_raises_an_interval_already_lower() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        with SwitchInterval(0.0005):
            assert sys.getswitchinterval() == pytest.approx(0.0001)
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    finally:
        sys.setswitchinterval(before)


def test_a_switch_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0 seconds, got 0"):
        SwitchInterval(0)


def test_a_render_inside_a_policy_load_does_not_undo_the_loads_interval() -> None:
    """The bug two set-and-restore users had: the render restored 5 ms under a running load,
    and the load then restored the render's 0.5 ms for good."""
    from runtime.metrics_http import RENDER_SWITCH_INTERVAL
    from runtime.watcher import _LOAD_SWITCH_INTERVAL

    before = sys.getswitchinterval()
    render = SwitchInterval(RENDER_SWITCH_INTERVAL).__enter__()
    load = SwitchInterval(_LOAD_SWITCH_INTERVAL).__enter__()
    render.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(_LOAD_SWITCH_INTERVAL)  # the load still runs
    load.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
