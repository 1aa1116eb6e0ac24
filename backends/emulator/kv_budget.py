"""SGLang's KV-cache budget for admission and decode, as pure functions over plain numbers.

SGLang admits optimistically (``schedule_policy.PrefillAdder``, ``schedule_batch.retract_decode``,
``global_config``):

* a running request is expected to need only ``new_token_ratio`` of the output tokens it may
  still produce (``min(max_new_tokens - output, 4096)``); the ratio starts at 0.7, decays each
  decode step to 0.7 × 0.14 over 600 steps, and is back at 0.7 whenever nothing runs;
* a waiting request is admitted when its uncached prompt plus ``min(max_new_tokens, 4096)``
  fits in what is free or evictable minus those expectations (and minus what requests admitted
  in the same step reserved in full);
* when a decode step finds no KV slot for every running request, requests are *retracted*
  (fewest output tokens first, longest prompt first among equals) until the rest have 20 steps
  of room; a retracted request frees its KV, waits again, and later recomputes prompt + output
  so far. The ratio is then raised to ``(decoded + 20 × remaining) / their max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "RETRACT_DECODE_STEPS",
    "BudgetRequest",
    "NewTokenRatio",
    "admits",
    "decode_room",
    "retraction_order",
    "running_expectation",
]

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20
_INIT_RATIO = 0.7
_MIN_RATIO = _INIT_RATIO * 0.14
_DECAY_STEPS = 600


class BudgetRequest(Protocol):
    @property
    def prompt_len(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def output_len(self) -> int: ...


@dataclass(slots=True)
class NewTokenRatio:
    """The share of a running request's remaining output tokens SGLang expects it to need."""

    value: float = _INIT_RATIO

    def decay(self) -> None:
        """One decode step passed without retraction."""
        self.value = max(self.value - (_INIT_RATIO - _MIN_RATIO) / _DECAY_STEPS, _MIN_RATIO)

    def reset(self) -> None:
        """Nothing runs."""
        self.value = _INIT_RATIO

    def after_retract(self, remaining: Sequence[BudgetRequest]) -> None:
        decoded = sum(r.output_len for r in remaining)
        total = sum(r.max_new_tokens for r in remaining)
        if total > 0:
            self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(remaining)) / total)


def _clip(n: int) -> int:
    return max(min(n, CLIP_MAX_NEW_TOKENS), 0)


def running_expectation(running: Sequence[BudgetRequest], ratio: float) -> float:
    """KV tokens the running requests are still expected to take."""
    return sum(_clip(r.max_new_tokens - r.output_len) * ratio for r in running)


def admits(uncached: int, max_new_tokens: int, available: int, reserved: float) -> bool:
    """Whether a request with ``uncached`` prompt tokens to compute may start now.

    ``available`` is free + evictable KV tokens, ``reserved`` what running requests are expected
    to take plus what this step already admitted (SGLang: ``total_tokens < rem_total_tokens``).
    """
    return uncached + _clip(max_new_tokens) < available - reserved


def retraction_order(decoding: Sequence[BudgetRequest]) -> list[int]:
    """Indices into ``decoding``; SGLang retracts from the end of this list (fewest output
    tokens first, then the longest prompt)."""
    return sorted(
        range(len(decoding)),
        key=lambda i: (decoding[i].output_len, -decoding[i].prompt_len),
        reverse=True,
    )


def decode_room(available: int, remaining: int, page_size: int = 1) -> bool:
    """After a retraction: whether ``remaining`` requests have 20 decode steps of KV room."""
    return available >= remaining * RETRACT_DECODE_STEPS * page_size
