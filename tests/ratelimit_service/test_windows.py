"""Calendar windows and the per-process window clock."""

from __future__ import annotations

from datetime import UTC, datetime

from quota.windows import window
from ratelimit_service.plan import WindowClock

S = 1_000_000


def us(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp()) * S


def test_calendar_months_and_days() -> None:
    i, reset = window("month", us(2026, 12, 31, 23, 59, 59))
    assert reset == us(2027, 1, 1) and window("month", reset)[0] == i + 1
    assert window("month", us(2026, 2, 1))[1] == us(2026, 3, 1)
    assert window("day", us(2026, 3, 1, 12))[1] == us(2026, 3, 2)
    assert window("minute", us(2026, 3, 1, 12, 0, 59) + 999_999)[1] == us(2026, 3, 1, 12, 1)


def test_window_clock_matches_window_across_boundaries_and_backwards_time() -> None:
    clock = WindowClock()
    times = [
        us(2026, 1, 31, 23, 59, 59),
        us(2026, 2, 1),
        us(2026, 2, 1) + 5,
        us(2026, 1, 15),
        us(2026, 3, 1) - 1,
    ]
    for unit in ("minute", "hour", "day", "month"):
        for t in times:
            assert clock(unit, t) == window(unit, t), (unit, t)
