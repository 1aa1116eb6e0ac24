"""SGLang's priority scheduling, as pure functions over plain values.

With ``--enable-priority-scheduling`` (``managers/scheduler.py``, ``managers/schedule_policy.py``):

* a request without a ``priority`` gets the worst one (``-sys.maxsize - 1``, or ``sys.maxsize``
  with ``--schedule-low-priority-values-first``); by default a larger value is more urgent;
* the waiting queue is sorted each step by priority, then by the time the request (re)entered
  the queue (``_sort_by_priority_and_fcfs``);
* when the batch is full (``max_running_requests``), a waiting request may *preempt* running
  ones (``PrefillAdder.preempt_to_schedule``): running requests are taken least urgent first,
  newest first among equals, while the priority gap exceeds
  ``--priority-scheduling-preemption-threshold`` (default 10), until their expected remaining
  output (``min(max_new - output, 4096) × new_token_ratio``) covers what the newcomer lacks
  (uncached prompt + ``min(max_new, 4096)`` − the remaining budget). None, or too few: no one
  is preempted. A preempted request frees its KV without inserting it (as a retraction), keeps
  its output and re-enters the waiting queue to recompute prompt + output;
* a full queue (``--max-queued-requests``) aborts its least urgent, newest request instead of
  the newcomer when the newcomer is strictly more urgent (``_abort_on_queued_limit``).

Without the flag a ``priority`` is ignored, unless ``--abort-on-priority-when-disabled``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from backends.emulator.kv_budget import CLIP_MAX_NEW_TOKENS

__all__ = [
    "ABORTED_BY_PRIORITY",
    "DEFAULT_PREEMPTION_THRESHOLD",
    "PRIORITY_DISABLED",
    "PriorityConfig",
    "PriorityRequest",
    "preemption_victims",
    "queue_eviction",
]

DEFAULT_PREEMPTION_THRESHOLD = 10  # server_args.priority_scheduling_preemption_threshold
ABORTED_BY_PRIORITY = "The request is aborted by a higher priority request."
PRIORITY_DISABLED = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)


class PriorityRequest(Protocol):
    """What the policy reads of a request (``EmuRequest`` has it)."""

    @property
    def priority(self) -> int: ...
    @property
    def queue_seq(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def output_len(self) -> int: ...


R = TypeVar("R", bound=PriorityRequest)


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    """SGLang's flags; the defaults are SGLang's (off)."""

    enabled: bool = False  # --enable-priority-scheduling
    low_values_first: bool = False  # --schedule-low-priority-values-first
    preemption_threshold: int = DEFAULT_PREEMPTION_THRESHOLD
    abort_when_disabled: bool = False  # --abort-on-priority-when-disabled

    @property
    def sign(self) -> int:
        """+1: smaller values are more urgent; −1: larger values are (SGLang's ``priority_sign``)."""
        return 1 if self.low_values_first else -1

    def resolve(self, priority: int | None) -> int | None:
        """The priority the scheduler uses: the worst when none is given; None when off (ignored).
        Raises ``ValueError`` (``PRIORITY_DISABLED``) when off and told to refuse priorities."""
        if not self.enabled:
            if priority is not None and self.abort_when_disabled:
                raise ValueError(PRIORITY_DISABLED)
            return None
        if priority is None:
            return sys.maxsize if self.low_values_first else -sys.maxsize - 1
        return priority

    def queue_order(self, waiting: Sequence[R]) -> list[R]:
        """The waiting queue sorted most urgent first, then by queue entry (stable)."""
        return sorted(waiting, key=lambda r: (r.priority * self.sign, r.queue_seq))

    def more_urgent(self, a: int, b: int) -> bool:
        return a * self.sign < b * self.sign


def queue_eviction(cfg: PriorityConfig, incoming: R, waiting: Sequence[R]) -> R | None:
    """With the queue full: the waiting request to abort for ``incoming`` (the least urgent,
    newest among equals, if ``incoming`` is strictly more urgent), or None (refuse ``incoming``)."""
    if not cfg.enabled or not waiting:
        return None
    worst = max(waiting, key=lambda r: (r.priority * cfg.sign, r.queue_seq))
    return worst if cfg.more_urgent(incoming.priority, worst.priority) else None


def _expected(r: PriorityRequest, ratio: float) -> float:
    return min(r.max_new_tokens - r.output_len, CLIP_MAX_NEW_TOKENS) * ratio


def preemption_victims(
    cfg: PriorityConfig,
    incoming: R,
    uncached: int,
    running: Sequence[R],
    remaining: float,
    ratio: float,
) -> list[R]:
    """The running requests ``incoming`` preempts (empty: none, or not enough to fit it).

    ``uncached`` is the prompt ``incoming`` must compute, ``remaining`` SGLang's
    ``rem_total_tokens`` (free + evictable − what running requests are expected to take),
    ``running`` the decoding requests that may be preempted.
    """
    lacking = uncached + min(incoming.max_new_tokens, CLIP_MAX_NEW_TOKENS) - remaining
    order = sorted(running, key=lambda r: (-r.priority * cfg.sign, -r.queue_seq))
    victims: list[R] = []
    for r in order:
        if (incoming.priority - r.priority) * -cfg.sign <= cfg.preemption_threshold:
            break
        victims.append(r)
        lacking -= _expected(r, ratio)
        if lacking <= 0:
            break
    return victims if victims and lacking <= 0 else []
