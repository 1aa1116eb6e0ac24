"""What one replica can do: the seed's flat-throughput model, or a named backend profile.

Both satisfy :class:`ReplicaModel`, the only thing the planner reads. A flat replica keeps its
total decode throughput ``T`` at every batch size, so each of ``b`` streams gets ``T/b`` tok/s and
the time between tokens is ``itl(b) = b/T`` (the seed's hand model), optionally never below
``min_itl`` (a lone stream's speed limit). A backend profile
(``backends.profiles``, shared with the emulator) has a measured ``itl(b)`` that rises with ``b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .errors import PlanInputError

__all__ = ["FlatReplica", "ReplicaModel", "for_workload", "profile_replica"]

_EPS = 1e-12  # budgets that are met exactly in reals (40/2000 = 0.02) must hold in floats


@runtime_checkable
class ReplicaModel(Protocol):
    """The capacity facts of one replica the planner needs."""

    @property
    def name(self) -> str: ...

    @property
    def prefill_tok_s(self) -> float: ...

    @property
    def step_overhead_s(self) -> float: ...

    @property
    def max_running_requests(self) -> int: ...

    @property
    def max_total_tokens(self) -> int: ...

    def itl_s(self, batch: int) -> float: ...

    def max_concurrency_for_tbt(self, tbt_s: float) -> int: ...


@dataclass(frozen=True)
class FlatReplica:
    """A replica with a fixed total decode throughput (tok/s) and prefill rate (tok/s)."""

    decode_tok_s: float
    prefill_tok_s: float
    max_running_requests: int = 1_000_000
    max_total_tokens: int = 1_000_000_000
    step_overhead_s: float = 0.0
    min_itl_s: float = 0.0  # a lone stream's time between tokens (0: the seed's pure model)
    name: str = "flat"

    def __post_init__(self) -> None:
        if not self.decode_tok_s > 0 or not math.isfinite(self.decode_tok_s):
            raise PlanInputError(
                "backend.decode_tok_s", f"must be a positive number, got {self.decode_tok_s}"
            )
        if not self.prefill_tok_s > 0 or not math.isfinite(self.prefill_tok_s):
            raise PlanInputError(
                "backend.prefill_tok_s", f"must be a positive number, got {self.prefill_tok_s}"
            )
        if self.max_running_requests < 1:
            raise PlanInputError("backend.max_running_requests", "must be ≥ 1")
        if self.max_total_tokens < 1:
            raise PlanInputError("backend.max_total_tokens", "must be ≥ 1")
        if self.step_overhead_s < 0:
            raise PlanInputError("backend.step_overhead_s", "must be ≥ 0")
        if self.min_itl_s < 0 or not math.isfinite(self.min_itl_s):
            raise PlanInputError("backend.min_itl", f"must be ≥ 0, got {self.min_itl_s}")

    def itl_s(self, batch: int) -> float:
        """Time between tokens of each of ``batch`` streams: max(b / T, min_itl) + overhead."""
        if batch < 1:
            raise PlanInputError("batch", f"must be ≥ 1, got {batch}")
        return self.step_overhead_s + max(batch / self.decode_tok_s, self.min_itl_s)

    def max_concurrency_for_tbt(self, tbt_s: float) -> int:
        """Largest b with itl(b) ≤ TBT, i.e. ⌊(TBT − overhead)·T⌋, capped at max_running_requests."""
        room = tbt_s - self.step_overhead_s
        if room + _EPS < self.min_itl_s:
            return 0
        n = math.floor(room * self.decode_tok_s * (1 + _EPS) + _EPS)
        return max(0, min(n, self.max_running_requests))


def profile_replica(name: str) -> ReplicaModel:
    """The backend profile called ``name`` (shared with the emulator), as a replica model."""
    from backends.errors import UnknownProfileError
    from backends.profiles import get_profile

    try:
        profile: ReplicaModel = get_profile(name)
    except UnknownProfileError as exc:
        raise PlanInputError("backend.profile", str(exc)) from exc
    return profile


def for_workload(
    replica: ReplicaModel, prompt_mean: float, output_mean: float, prefix_hit_rate: float
) -> tuple[ReplicaModel, str]:
    """``replica`` with a profile's context terms (KV read per decoded token, attention per
    prefilled token) folded in at this workload's means, and the formula that says how (empty
    when the replica has no context terms: it is returned unchanged).

    A decoding stream holds its prompt and half its output on average; an uncached prompt token
    attends to the cached prefix and half the uncached part; the per-step prefill cost is spread
    over the uncached part (at most one chunk)."""
    at_context = getattr(replica, "at_context", None)
    if at_context is None:  # a flat replica has no context terms
        return replica, ""
    cached = prefix_hit_rate * prompt_mean
    uncached = prompt_mean - cached
    decode_ctx, prefill_ctx = prompt_mean + output_mean / 2, cached + uncached / 2
    folded: ReplicaModel = at_context(decode_ctx, prefill_ctx, max(uncached, 1.0))
    if folded is replica:  # nothing to fold (at_context says so; a per-step prefill cost counts)
        return replica, ""
    note = (
        f"decoding streams hold prompt + output/2 = {prompt_mean:g} + {output_mean:g}/2 = "
        f"{decode_ctx:.6g} tokens, so itl(1) = {folded.itl_s(1) * 1e3:.4g} ms "
        f"(at 0 tokens: {replica.itl_s(1) * 1e3:.4g} ms); an uncached prompt token attends to "
        f"h·prompt + (1 − h)·prompt/2 = {prefill_ctx:.6g} tokens, so prefill runs at "
        f"{folded.prefill_tok_s:.5g} tok/s ({replica.prefill_tok_s:.5g} at 0 tokens with no "
        "per-step cost)"
    )
    return folded, note
