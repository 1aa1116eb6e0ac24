"""How a pool's SGLang replicas schedule their queue: SGLang's priority scheduling.

``pools.NAME.priority_scheduling`` turns on ``--enable-priority-scheduling`` for every replica
the pool starts (the emulators of ``tokenweir up``, and a real SGLang through
``backends.sglang``, which takes the same flags): the waiting queue is ordered by the request
body's ``priority`` and a request more urgent by more than ``preemption_threshold`` preempts
running ones (docs/emulator.md has SGLang's rules). Off by default, as in SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from controlplane.policy.decode import Range

__all__ = ["PriorityScheduling"]


@dataclass(frozen=True)
class PriorityScheduling:
    enabled: bool = False
    # SGLang's --priority-scheduling-preemption-threshold (default 10); a negative one would let
    # equals preempt each other back and forth, so the policy stops at 0
    preemption_threshold: Annotated[int, Range(0, 1_000_000_000)] = 10
    low_values_first: bool = False  # --schedule-low-priority-values-first

    def __post_init__(self) -> None:
        if not self.enabled and (self.preemption_threshold != 10 or self.low_values_first):
            raise ValueError(
                "preemption_threshold and low_values_first take effect only with enabled: true"
            )

    def server_flags(self) -> list[str]:
        """The SGLang server flags (the emulator takes the same); none when off."""
        if not self.enabled:
            return []
        flags = ["--enable-priority-scheduling"]
        flags += ["--priority-scheduling-preemption-threshold", str(self.preemption_threshold)]
        if self.low_values_first:
            flags.append("--schedule-low-priority-values-first")
        return flags
