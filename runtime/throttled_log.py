"""A warning at most once per interval: failures on the request path log why, not once per
request (used by the filter server's key store, budget reader and tokens plugin)."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """A warning at most once per ``interval`` seconds, saying how many were held back."""

    def __init__(self, clock: Callable[[], float], interval: float, logger: logging.Logger):
        self._clock = clock
        self._interval = interval
        self._logger = logger
        self._next = float("-inf")
        self._held = 0

    def warning(self, msg: str, *args: object) -> None:
        now = self._clock()
        if now < self._next:
            self._held += 1
            return
        more = f" ({self._held} more like it in the last {self._interval:g}s)" if self._held else ""
        self._logger.warning(msg + more, *args)
        self._held = 0
        self._next = now + self._interval
