"""Generation throughput over a sliding window (SGLang's ``sglang:gen_throughput`` gauge)."""

from __future__ import annotations

import collections

__all__ = ["GenThroughput"]

_WINDOW_S = 5.0


class GenThroughput:
    """Tokens per second over the last few seconds of steps."""

    def __init__(self, window_s: float = _WINDOW_S) -> None:
        self._window_s = window_s
        self._steps: collections.deque[tuple[float, int]] = collections.deque()

    def record(self, now: float, tokens: int) -> None:
        """One step ended at ``now`` and produced ``tokens``."""
        self._steps.append((now, tokens))
        while self._steps and self._steps[0][0] < now - self._window_s:
            self._steps.popleft()

    def value(self) -> float:
        if len(self._steps) < 2:
            return 0.0
        span = self._steps[-1][0] - self._steps[0][0]
        tokens = sum(n for _, n in self._steps) - self._steps[0][1]
        return tokens / span if span > 0 else 0.0
