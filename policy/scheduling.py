"""How a pool's SGLang replicas schedule their queue: SGLang's priority scheduling.

``pools.NAME.priority_scheduling`` turns on ``--enable-priority-scheduling`` for every replica
the pool starts (the emulators of ``tokenweir up``, and a real SGLang through
``backends.sglang``, which takes the same flags): the waiting queue is ordered by the request
body's ``priority`` and a request more urgent by more than ``preemption_threshold`` preempts
running ones (docs/emulator.md has SGLang's rules). Off by default, as in SGLang.

``balance`` says how a ranked pool's requests choose a replica. ``lane`` (the default for a
``ring_hash`` pool): the filter server names, per request, the replica with the fewest requests
in flight that this request cannot preempt (for interactive: interactive; for batch: all), a
session staying on its rendezvous replica while that one is within the pool's bounded load
(``filters/plugins/admission/spread.py``); Envoy's override-host load balancer honours it, ring hash
stays the fallback. ``ring``: Envoy's ring hash with bounded load over all active requests,
which lets one replica fill with interactive work while another's batch could be preempted. A
``prefix_index`` pool is balanced by its endpoint picker (``balance: lane`` is an error there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from policy.decode import Range

__all__ = ["PriorityScheduling"]


@dataclass(frozen=True)
class PriorityScheduling:
    enabled: bool = False
    # SGLang's --priority-scheduling-preemption-threshold (default 10); a negative one would let
    # equals preempt each other back and forth, so the policy stops at 0
    preemption_threshold: Annotated[int, Range(0, 1_000_000_000)] = 10
    low_values_first: bool = False  # --schedule-low-priority-values-first
    balance: Literal["lane", "ring"] | None = None  # None: lane (ring_hash pools)

    def __post_init__(self) -> None:
        if not self.enabled and (
            self.preemption_threshold != 10 or self.low_values_first or self.balance is not None
        ):
            raise ValueError(
                "preemption_threshold, low_values_first and balance take effect only with "
                "enabled: true"
            )

    def preempts(self, mine: int, theirs: int) -> bool:
        """A request of priority ``mine`` may preempt a running one of ``theirs`` (the gap is
        more than the threshold, in the pool's direction), as SGLang decides."""
        gap = theirs - mine if self.low_values_first else mine - theirs
        return gap > self.preemption_threshold

    def server_flags(self) -> list[str]:
        """The SGLang server flags (the emulator takes the same); none when off."""
        if not self.enabled:
            return []
        flags = ["--enable-priority-scheduling"]
        flags += ["--priority-scheduling-preemption-threshold", str(self.preemption_threshold)]
        if self.low_values_first:
            flags.append("--schedule-low-priority-values-first")
        return flags
