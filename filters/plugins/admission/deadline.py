"""Client deadlines: ``x-request-deadline-ms`` (absolute, Unix epoch milliseconds) or
``x-request-timeout-ms`` (relative, milliseconds from arrival); the earlier one wins. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from filters.errors import ClientError

__all__ = ["DEADLINE_HEADER", "TIMEOUT_HEADER", "remaining_seconds"]

DEADLINE_HEADER = "x-request-deadline-ms"
TIMEOUT_HEADER = "x-request-timeout-ms"
_MAX_MS = 7 * 86400 * 1000  # a relative timeout longer than a week is a mistake


def _number(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = float("nan")
    if not value == value or value < 0 or value == float("inf"):  # NaN, negative, inf
        raise ClientError(
            400,
            f"{name} must be a non-negative number of milliseconds, got {raw!r}",
            reason="bad_deadline",
            param=name,
        )
    return value


def remaining_seconds(headers: Mapping[str, str], wall_now: float) -> float | None:
    """Seconds the client still grants this request (may be <= 0: already late), or None."""
    out: float | None = None
    absolute = _number(headers, DEADLINE_HEADER)
    if absolute is not None:
        out = absolute / 1000.0 - wall_now
    relative = _number(headers, TIMEOUT_HEADER)
    if relative is not None:
        rel = min(relative, _MAX_MS) / 1000.0
        out = rel if out is None else min(out, rel)
    return out
