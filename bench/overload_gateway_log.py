"""The gateway's own view of its rejections: Envoy's access log (``%DURATION%``, from the first
byte received to the last byte sent) for the requests it answered itself with 429, 503 or 504.

The overload benchmark's rejection latency is measured by its load client, from send to status
line, so it carries the client's own loop and the box's run queue too. This is the other end of
the same answers: what the gateway took. Pure parsing (``rejection_durations``) plus a tail of
one log file between two points of a run (``AccessLogTail``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from overload_stats import QUEUED_SHEDS, percentile

__all__ = ["AccessLogTail", "rejection_durations", "summary"]

_REJECTED = frozenset({429, 503, 504})


_QUEUED_DETAILS = frozenset(f"tokenweir_shed_{r}" for r in QUEUED_SHEDS)


def rejection_durations(lines: Iterable[str], *, at_arrival: bool = False) -> list[float]:
    """``duration_ms`` of each access-log line (tokenweir's JSON fields) that is a rejection the
    gateway answered itself: status 429/503/504 and no upstream replica. ``at_arrival``: only
    those not answered after a wait in a gateway queue (the client's split, by the answer's
    ``details``: ``tokenweir_shed_fell_behind`` / ``_timed_out`` waited)."""
    out: list[float] = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue  # Envoy's own log lines share the file
        try:
            row: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("status") not in _REJECTED or row.get("upstream_replica") not in (None, "-"):
            continue
        if at_arrival and row.get("details") in _QUEUED_DETAILS:
            continue
        duration = row.get("duration_ms")
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            out.append(float(duration))
    return out


def summary(durations: list[float]) -> dict[str, Any]:
    """Count, p50, p99 and max in ms (Envoy's ``%DURATION%`` is whole milliseconds)."""
    return {
        "count": len(durations),
        "p50": percentile(durations, 0.5),
        "p99": percentile(durations, 0.99),
        "max": max(durations) if durations else None,
    }


class AccessLogTail:
    """The lines one log file gained since ``mark()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def mark(self) -> None:
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        # a line still being written at the end is left out (the split's last piece)
        return data.decode(errors="replace").split("\n")[:-1]
