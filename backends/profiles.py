"""Named timing and capacity profiles of SGLang servers, for the emulator and the planner.

A profile is a frozen, documented set of numbers. The timing model of one scheduler step is::

    step = step_overhead_s
         + prefill_cost(n, attended)           (when the step prefills n > 0 uncached tokens)
         + decode_cost(b, kv)                  (when b > 0 streams decode in this step)
    prefill_cost(n, attended) = prefill_base_s + n / prefill_tok_s
                              + prefill_per_ctx_token_s * attended
    decode_cost(b, kv) = decode_base_s + decode_per_seq_s * b + decode_per_seq2_s * b**2
                       + decode_per_kv_token_s * kv

where ``attended`` counts (new token, token it attends to) pairs, a chunk of n tokens after p
cached ones giving n * (p + n / 2), and ``kv`` is the tokens the b decoding streams hold (prompt
and output so far): the attention work that grows with context. Profiles whose three context
terms are 0 (the fitted ``llama-3.1-8b-h100``, the seed's) depend on the batch size alone; there
the quadratic term stands in for attention and KV reads growing with the batch. A pure decode step
with ``b`` streams of ``context`` tokens takes ``itl_s(b, context)``: the time between two tokens
of each stream. ``at_context`` folds the context terms into the batch-only form for a workload's
mean context (the capacity planner's view).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from backends.errors import UnknownProfileError

__all__ = ["BackendProfile", "get_profile", "profile_names"]

_TBT_EPS = 1e-12  # tolerance so that exact budgets (e.g. 20 ms at 40 streams) hold in floats


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """Timing and capacity of one SGLang server (one GPU, or one tensor-parallel group)."""

    name: str
    description: str
    source: str
    step_overhead_s: float
    prefill_tok_s: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_seq2_s: float
    max_running_requests: int
    max_queued_requests: int
    max_total_tokens: int
    page_size: int = 1
    chunked_prefill_size: int = 8192
    context_length: int = 131072
    decode_per_kv_token_s: float = 0.0  # per token held by a decoding stream (its KV is read)
    prefill_base_s: float = 0.0  # per step that prefills anything (launches, weight reads)
    prefill_per_ctx_token_s: float = 0.0  # per (new token, token it attends to) pair

    def __post_init__(self) -> None:
        positive = {
            "prefill_tok_s": self.prefill_tok_s,
            "max_running_requests": self.max_running_requests,
            "max_total_tokens": self.max_total_tokens,
            "page_size": self.page_size,
            "chunked_prefill_size": self.chunked_prefill_size,
            "context_length": self.context_length,
        }
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"profile {self.name!r}: {key} must be > 0, got {value!r}")
        non_negative = {
            "step_overhead_s": self.step_overhead_s,
            "decode_base_s": self.decode_base_s,
            "decode_per_seq_s": self.decode_per_seq_s,
            "decode_per_seq2_s": self.decode_per_seq2_s,
            "max_queued_requests": self.max_queued_requests,
            "decode_per_kv_token_s": self.decode_per_kv_token_s,
            "prefill_base_s": self.prefill_base_s,
            "prefill_per_ctx_token_s": self.prefill_per_ctx_token_s,
        }
        for key, value in non_negative.items():
            if value < 0:
                raise ValueError(f"profile {self.name!r}: {key} must be >= 0, got {value!r}")
        if self.itl_s(1) <= 0:
            raise ValueError(f"profile {self.name!r}: a decode step must cost some time")

    @property
    def context_free(self) -> bool:
        """True when step times depend on token counts and batch size alone, not on context."""
        return not (self.decode_per_kv_token_s or self.prefill_per_ctx_token_s)

    def decode_cost_s(self, batch: int, kv_tokens: float = 0) -> float:
        """Decode part of a step in which ``batch`` streams holding ``kv_tokens`` tokens in all
        each produce one token."""
        if batch <= 0:
            return 0.0
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch
            + self.decode_per_seq2_s * batch**2
            + self.decode_per_kv_token_s * kv_tokens
        )

    def prefill_cost_s(self, tokens: int, attended: float = 0) -> float:
        """Time to prefill ``tokens`` uncached prompt tokens making ``attended`` (new token,
        context token) pairs; a chunk of n after p cached tokens makes n * (p + n / 2)."""
        if tokens <= 0:
            return 0.0
        return (
            self.prefill_base_s
            + tokens / self.prefill_tok_s
            + self.prefill_per_ctx_token_s * attended
        )

    def step_s(
        self,
        prefill_tokens: int,
        decode_batch: int,
        decode_kv_tokens: float = 0,
        prefill_attended: float = 0,
    ) -> float:
        """Duration of one scheduler step (zero when there is no work)."""
        if prefill_tokens <= 0 and decode_batch <= 0:
            return 0.0
        return (
            self.step_overhead_s
            + self.prefill_cost_s(prefill_tokens, prefill_attended)
            + self.decode_cost_s(decode_batch, decode_kv_tokens)
        )

    def itl_s(self, batch: int, context: float = 0) -> float:
        """Time between two tokens of each stream when ``batch`` streams of ``context`` tokens
        each decode together."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        return self.step_overhead_s + self.decode_cost_s(batch, batch * context)

    def at_context(
        self, decode_context: float, prefill_context: float = 0, prefill_chunk: float = 0
    ) -> BackendProfile:
        """This profile with its context terms folded in for one workload: decoding streams of
        ``decode_context`` tokens on average, prefill tokens attending to ``prefill_context``
        tokens on average, in chunks of ``prefill_chunk`` tokens (default: the chunked-prefill
        size; the per-step prefill cost is spread over the chunk). The result has the same
        ``itl_s(b)`` as ``itl_s(b, decode_context)`` and a plain ``prefill_tok_s``."""
        if decode_context < 0 or prefill_context < 0 or prefill_chunk < 0:
            raise ValueError("contexts and chunk must be >= 0")
        if self.context_free and not self.prefill_base_s:
            return self
        chunk = min(prefill_chunk or self.chunked_prefill_size, self.chunked_prefill_size)
        per_token = (
            1.0 / self.prefill_tok_s
            + self.prefill_per_ctx_token_s * prefill_context
            + self.prefill_base_s / max(chunk, 1.0)
        )
        return dataclasses.replace(
            self,
            decode_per_seq_s=self.decode_per_seq_s + self.decode_per_kv_token_s * decode_context,
            decode_per_kv_token_s=0.0,
            prefill_tok_s=1.0 / per_token,
            prefill_base_s=0.0,
            prefill_per_ctx_token_s=0.0,
        )

    def decode_throughput_tok_s(self, batch: int) -> float:
        """Output tokens per second of the whole server with ``batch`` streams decoding."""
        return batch / self.itl_s(batch)

    def max_concurrency_for_tbt(self, tbt_s: float) -> int:
        """Largest batch whose time between tokens stays within ``tbt_s`` (0 if none does).

        Capped at ``max_running_requests``: the server never runs more streams than that.
        """
        if tbt_s + _TBT_EPS < self.itl_s(1):
            return 0
        # itl_s is increasing in batch: solve the quadratic, then correct for rounding.
        a, b = self.decode_per_seq2_s, self.decode_per_seq_s
        c = self.step_overhead_s + self.decode_base_s - tbt_s
        if a > 0:
            guess = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)
        elif b > 0:
            guess = -c / b
        else:
            guess = float(self.max_running_requests)
        n = max(1, min(int(guess), self.max_running_requests))
        while n < self.max_running_requests and self.itl_s(n + 1) <= tbt_s + _TBT_EPS:
            n += 1
        while n > 1 and self.itl_s(n) > tbt_s + _TBT_EPS:
            n -= 1
        return n

    def peak_decode_throughput_tok_s(self) -> tuple[int, float]:
        """(batch, tok/s) where decode throughput peaks within ``max_running_requests``."""
        best = max(range(1, self.max_running_requests + 1), key=self.decode_throughput_tok_s)
        return best, self.decode_throughput_tok_s(best)


def _profiles() -> dict[str, BackendProfile]:
    # Built on each call: no module-level mutable state. Profiles are frozen values.
    llama = BackendProfile(
        name="llama-3.1-8b-h100",
        description="Llama-3.1-8B-Instruct, bf16, one H100 80GB, SGLang defaults",
        source=(
            "decode: least-squares fit of a published Llama-3.1-8B single-GPU sweep "
            "(concurrency 1 -> 4.6 ms ITL, 50 -> 5.9 ms, 100 -> 7.6 ms, 250 -> 16.1 ms; "
            "see /work/shared/REFERENCE.md); prefill: ~16 GFLOP/token at ~400 TFLOP/s "
            "effective bf16 = 25k tok/s (estimate); KV: 128 KiB/token (32 layers x 8 KV "
            "heads x 128 dims x K,V x 2 bytes) in ~55 GiB left after weights = ~430k tokens"
        ),
        step_overhead_s=0.0,
        prefill_tok_s=25_000.0,
        decode_base_s=4.5989e-3,
        decode_per_seq_s=1.98683e-5,
        decode_per_seq2_s=1.04496e-7,
        max_running_requests=256,
        max_queued_requests=1024,
        max_total_tokens=430_000,
        page_size=1,
        chunked_prefill_size=8192,
        context_length=131072,
    )
    h200 = BackendProfile(
        name="llama-3.1-8b-h200",
        description=(
            "Llama-3.1-8B shapes, bf16, one H200 141GB, measured step times with their context "
            "terms (plain PyTorch with CUDA graphs: SGLang's fused kernels are as fast or faster)"
        ),
        source=(
            "bench/gpu_profile.py on a lent H200 (bench/results/gpu_h200_llama8b_{1,2}.json), "
            "relative least-squares fits, non-negative: decode over 25 steps (B 1-512 streams, "
            "1k-12k tokens each; rms error 8%): 6.41 ms + 47.5 ns*B^2 + 30.7 ns per KV token "
            "(128 KiB at 4.3 TB/s, the card's copy bandwidth); prefill over 16 chunks (256-8192 "
            "new tokens after 0-32k cached; rms 12%): 10.6 ms per step + 1/48.7k s per token + "
            "2.06 ns per (new, attended) token pair; KV: 128 KiB/token in 0.88 of 139.8 GiB less "
            "16.1 GB of weights = 885k tokens"
        ),
        step_overhead_s=0.0,
        prefill_tok_s=48_707.0,
        decode_base_s=6.40658e-3,
        decode_per_seq_s=0.0,
        decode_per_seq2_s=4.74718e-8,
        max_running_requests=256,
        max_queued_requests=1024,
        max_total_tokens=885_000,
        page_size=1,
        chunked_prefill_size=8192,
        context_length=131072,
        decode_per_kv_token_s=3.06773e-8,
        prefill_base_s=10.6195e-3,
        prefill_per_ctx_token_s=2.05779e-9,
    )
    seed = BackendProfile(
        name="seed-2k",
        description="the seed's GPU: ~2,000 decode tok/s, 40 streams within a 20 ms TBT budget",
        source=(
            "seed 001: one GPU at ~2000 tok/s, 20 ms TBT budget -> 40 streams; decode "
            "10 ms + 0.15 ms*b + 2.5 us*b^2 gives itl(40) = 20 ms (2000 tok/s), peak "
            "~2.15k tok/s near b = 63; prefill 10k tok/s and 200k KV tokens are assumptions"
        ),
        step_overhead_s=0.0,
        prefill_tok_s=10_000.0,
        decode_base_s=10e-3,
        decode_per_seq_s=0.15e-3,
        decode_per_seq2_s=2.5e-6,
        max_running_requests=64,
        max_queued_requests=256,
        max_total_tokens=200_000,
        page_size=1,
        chunked_prefill_size=4096,
        context_length=32768,
    )
    return {p.name: p for p in (llama, h200, seed)}


def profile_names() -> list[str]:
    """Names of the built-in profiles, sorted."""
    return sorted(_profiles())


def get_profile(name: str) -> BackendProfile:
    """The profile called ``name``; ``UnknownProfileError`` (a ``KeyError``) lists known names."""
    profiles = _profiles()
    try:
        return profiles[name]
    except KeyError as exc:
        raise UnknownProfileError(name, sorted(profiles)) from exc
