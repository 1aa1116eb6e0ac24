"""What the scheduler reports: events for metrics (``SchedulerObserver``) and its gauges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from backends.emulator.request import EmuRequest

__all__ = ["SchedulerObserver", "SchedulerStats"]


class SchedulerObserver(Protocol):
    """Receives events for metrics (implemented with prometheus in ``metrics.py``)."""

    def on_admit(self, req: EmuRequest, queue_time_s: float) -> None: ...
    def on_first_token(self, req: EmuRequest, ttft_s: float) -> None: ...
    def on_decode(self, tokens: int, itls_s: list[float]) -> None: ...
    def on_finish(self, req: EmuRequest, e2e_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    cached_tokens_in_tree: int
