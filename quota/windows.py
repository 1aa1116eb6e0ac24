"""Calendar windows (UTC) for long-window budgets: pure functions of ``now`` in microseconds."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["UNITS", "window"]

UNITS: tuple[str, ...] = ("minute", "hour", "day", "month")
_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def window(unit: str, now_us: int) -> tuple[int, int]:
    """``(index, reset_us)`` of the window holding ``now_us``: minutes, hours and days since the
    epoch, or ``year * 12 + month - 1`` for calendar months; reset is when the next one starts."""
    if unit == "month":
        t = datetime.fromtimestamp(now_us // 1_000_000, tz=UTC)
        index = t.year * 12 + t.month - 1
        ny, nm = divmod(index + 1, 12)
        reset = datetime(ny, nm + 1, 1, tzinfo=UTC)
        return index, int(reset.timestamp()) * 1_000_000
    seconds = _SECONDS[unit]
    index = now_us // (seconds * 1_000_000)
    return index, (index + 1) * seconds * 1_000_000
