"""The interpreter's thread switch interval, lowered while a thread does long CPU work beside a
serving event loop, by every part of a process through one count.

CPython hands the GIL to a waiting thread only after the holder has run for the switch interval
(5 ms by default). An event loop lets go of the GIL at every socket call, so while a worker
thread renders a page or builds a policy, each of the loop's steps may wait that long. A lower
interval makes the worker yield sooner. The interval is process-wide: two users that each set and
restore it would undo each other (one restores 5 ms while the other still works), so every user
goes through :class:`SwitchInterval`, which keeps the lowest interval any holder wants and puts
back the one it found when the last holder leaves.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

__all__ = ["SwitchInterval"]


class SwitchInterval:
    """``with SwitchInterval(s):`` runs its body with the switch interval at most ``s`` and
    restores the one it found when the last holder leaves (holders may nest and overlap, from
    any thread; the count is process-wide, :data:`_HOLDERS`)."""

    def __init__(self, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"switch interval must be > 0 seconds, got {interval}")
        self.interval = interval

    def __enter__(self) -> SwitchInterval:
        with _HOLDERS.lock:
            if not _HOLDERS.wanted:
                _HOLDERS.saved = sys.getswitchinterval()
            _HOLDERS.wanted.append(self.interval)
            _HOLDERS.apply()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with _HOLDERS.lock:
            _HOLDERS.wanted.remove(self.interval)
            _HOLDERS.apply()


class _Holders:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved = sys.getswitchinterval()
        self.wanted: list[float] = []  # the intervals of the holders inside
        self.applied: float | None = None  # what they set (None: the saved one is in force)

    def apply(self) -> None:
        """Set the lowest wanted interval when it is below the saved one, else the saved one;
        call ``setswitchinterval`` only on a change (it stores whole microseconds, so setting
        what it returned can round the value down)."""
        low = min(self.wanted, default=None)
        target = low if low is not None and low < self.saved else None
        if target == self.applied:
            return
        sys.setswitchinterval(target if target is not None else self.saved)
        self.applied = target


_HOLDERS = _Holders()
