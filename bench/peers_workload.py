"""What the gateway comparison (bench/peers.py) sends, and the arithmetic it reports. Pure.

Requests: streaming chat completions whose prompt and output lengths are drawn from the Mooncake
trace sample (``bench/data/mooncake_conversation_every12th.jsonl``, divided by ``length_scale``;
prompts keep the trace's 512-token block structure, so prefixes are shared as in production).
Tenants: a multi-tenant mix of tiers (``TIERS``: share of the traffic, tenants, key prefix); each
request goes to one tenant of a tier drawn by share. The k6 scenarios (``bench/peers_k6.js``) read
the list this module writes; the streaming client reads the same requests.

Budget arithmetic: a token budget of ``burst`` tokens refilled at ``refill_per_second`` holds over
a burst of parallel requests when the tokens the backends served (prompt + completion, counted by
the emulators' own counters) stay within ``burst + refill * elapsed``; the excess is the overshoot.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from overload_workload import scaled_lengths

from backends.emulator.trace import TraceRecord, prompt_text

__all__ = [
    "TIERS",
    "BudgetOutcome",
    "PeerRequest",
    "Tier",
    "budget_outcome",
    "build_requests",
    "chat_body",
    "mean_tokens",
    "percentile",
    "tenant_keys",
]


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    share: float  # fraction of the requests
    tenants: int


TIERS = (Tier("free", 0.6, 6), Tier("pro", 0.3, 3), Tier("enterprise", 0.1, 1))


@dataclass(frozen=True, slots=True)
class PeerRequest:
    key: str  # the tenant's API key
    tier: str
    prompt: str
    prompt_tokens: int
    max_tokens: int


def tenant_keys(tiers: Sequence[Tier] = TIERS) -> dict[str, list[str]]:
    """API keys per tier: ``tw-peers-<tier>-<i>``."""
    return {t.name: [f"tw-peers-{t.name}-{i}" for i in range(t.tenants)] for t in tiers}


def build_requests(
    records: Sequence[TraceRecord],
    count: int,
    *,
    length_scale: int,
    rng: random.Random,
    tiers: Sequence[Tier] = TIERS,
) -> list[PeerRequest]:
    """``count`` requests: trace records in a shuffled order (no prompt repeats until the sample
    is used up), a tier drawn by share, a tenant of that tier drawn uniformly."""
    if not records:
        raise ValueError("no trace records to draw from")
    total = sum(t.share for t in tiers)
    if not tiers or total <= 0:
        raise ValueError("tiers need a positive total share")
    keys = tenant_keys(tiers)
    order = list(range(len(records)))
    rng.shuffle(order)
    out: list[PeerRequest] = []
    for i in range(count):
        rec = records[order[i % len(order)]]
        prompt_tokens, max_tokens = scaled_lengths(rec, length_scale)
        pick = rng.random() * total
        tier = tiers[-1]
        for t in tiers:
            if pick < t.share:
                tier = t
                break
            pick -= t.share
        out.append(
            PeerRequest(
                key=rng.choice(keys[tier.name]),
                tier=tier.name,
                prompt=prompt_text(rec, length_scale),
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
            )
        )
    return out


def chat_body(req: PeerRequest, model: str, stream: bool = True) -> dict[str, object]:
    """The OpenAI chat body every arm gets: streaming with usage in the last chunk, or (with
    ``stream=False``) one JSON answer, which leaves a gateway's per-chunk cost out."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": req.prompt}],
        "max_tokens": req.max_tokens,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def mean_tokens(requests: Sequence[PeerRequest]) -> float:
    """Mean prompt + output tokens per request (what a request costs a token budget)."""
    if not requests:
        raise ValueError("no requests")
    return sum(r.prompt_tokens + r.max_tokens for r in requests) / len(requests)


@dataclass(frozen=True, slots=True)
class BudgetOutcome:
    allowed: float  # burst + refill * elapsed
    admitted: float  # tokens the backends served
    overshoot: float  # admitted - allowed, never below 0
    held: bool

    @property
    def overshoot_ratio(self) -> float:
        return self.overshoot / self.allowed if self.allowed > 0 else math.inf


def budget_outcome(
    burst: float, refill_per_second: float, elapsed_s: float, admitted: float
) -> BudgetOutcome:
    """Whether ``admitted`` tokens stayed within a budget over ``elapsed_s`` seconds."""
    if burst < 0 or refill_per_second < 0 or elapsed_s < 0 or admitted < 0:
        raise ValueError("budget, refill, elapsed time and admitted tokens must be >= 0")
    allowed = burst + refill_per_second * elapsed_s
    over = max(0.0, admitted - allowed)
    return BudgetOutcome(allowed=allowed, admitted=admitted, overshoot=over, held=over == 0)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None when empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
