"""What the overload benchmark sends: Mooncake-shaped requests, a lane mix, open-loop arrivals.

Pure (no I/O but reading the sample, no clock): the arrival schedule comes from a seeded
``random.Random``, so every arm of one run gets exactly the same requests at the same offsets.

Lengths come from ``bench/data/mooncake_conversation_every12th.jsonl`` (every 12th request of the
one-hour Mooncake conversation trace), divided by ``length_scale`` (prompts keep their 512-token
block structure, so prefixes are shared as in the trace). The pool's capacity in requests/s is
computed from the emulator's timing profile (``pool_capacity_rps``), so "1x" means the arrival
rate that keeps the pool's GPUs exactly busy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.emulator.trace import TraceRecord, load_trace, prompt_text, scaled_blocks
from backends.profiles import BackendProfile

__all__ = [
    "SAMPLE",
    "Arrival",
    "Phase",
    "load_sample",
    "mean_lengths",
    "pool_capacity_rps",
    "schedule",
    "spike_phases",
]

SAMPLE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_every12th.jsonl"
LANES = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One logical request: when it is first sent (seconds from the level's start) and what."""

    at: float
    lane: str  # "interactive" | "batch"
    tenant: int  # index of the tenant within its lane
    prompt: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of constant offered load: ``multiple`` x capacity for ``seconds``."""

    seconds: float
    multiple: float


def scaled_lengths(rec: TraceRecord, length_scale: int) -> tuple[int, int]:
    """(prompt tokens, output tokens) of one record after dividing by ``length_scale``."""
    prompt = sum(n for _, n in scaled_blocks(rec, length_scale))
    return prompt, max(1, math.ceil(rec.output_length / length_scale))


def mean_lengths(records: Sequence[TraceRecord], length_scale: int) -> tuple[float, float]:
    """Mean (prompt, output) tokens of the sample after scaling."""
    pairs = [scaled_lengths(r, length_scale) for r in records]
    return (
        sum(p for p, _ in pairs) / len(pairs),
        sum(o for _, o in pairs) / len(pairs),
    )


def pool_capacity_rps(
    profile: BackendProfile,
    *,
    replicas: int,
    running: int,
    mean_prompt: float,
    mean_output: float,
    time_scale: float,
) -> float:
    """Requests/s the pool completes when every replica runs ``running`` streams.

    Per replica and second of GPU time, X requests cost ``X * mean_prompt / prefill_tok_s`` of
    prefill and ``X * mean_output / running`` decode steps of ``itl_s(running)`` each (one token
    per stream per step), so ``X = 1 / (mean_output * itl / running + mean_prompt / prefill)``;
    prefix-cache hits are ignored (a conservative capacity). ``time_scale`` stretches every
    emulated duration, so the wall-clock capacity is divided by it.
    """
    if replicas < 1 or running < 1 or time_scale <= 0:
        raise ValueError("replicas and running must be >= 1 and time_scale > 0")
    per_request_s = (
        mean_output * profile.itl_s(running) / running + mean_prompt / profile.prefill_tok_s
    )
    return replicas / (per_request_s * time_scale)


def schedule(
    records: Sequence[TraceRecord],
    phases: Sequence[Phase],
    *,
    capacity_rps: float,
    interactive_share: float,
    tenants_per_lane: int,
    length_scale: int,
    rng: random.Random,
) -> list[Arrival]:
    """Poisson arrivals through ``phases`` (each at ``multiple x capacity_rps``), a request drawn
    from ``records`` without replacement (a shuffled order), its lane interactive with
    ``interactive_share``."""
    if not records:
        raise ValueError("no trace records to draw from")
    if not 0.0 <= interactive_share <= 1.0:
        raise ValueError("interactive_share must be within [0, 1]")
    out: list[Arrival] = []
    order = list(range(len(records)))  # without replacement: no prompt repeats in one run
    rng.shuffle(order)
    start = 0.0
    for phase in phases:
        rate = phase.multiple * capacity_rps
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + phase.seconds:
                break
            rec = records[order[len(out) % len(order)]]
            prompt_tokens, max_tokens = scaled_lengths(rec, length_scale)
            out.append(
                Arrival(
                    at=t,
                    lane="interactive" if rng.random() < interactive_share else "batch",
                    tenant=rng.randrange(tenants_per_lane),
                    prompt=prompt_text(rec, length_scale),
                    prompt_tokens=prompt_tokens,
                    max_tokens=max_tokens,
                )
            )
        start += phase.seconds
    return out


def spike_phases(
    base: float, spike: float, before: float, during: float, after: float
) -> list[Phase]:
    """A retry-storm timeline: ``base`` load, a ``spike``, then ``base`` again."""
    return [Phase(before, base), Phase(during, spike), Phase(after, base)]


def load_sample(path: Path = SAMPLE) -> list[TraceRecord]:
    return load_trace(path)
