"""The endpoint picker's decision: a pure function over plain data (no I/O, no clock).

For each candidate replica (known to the prefix index, not marked unhealthy) the picker knows
the share of the prompt it holds (the bytes its matched checkpoints cover / prompt bytes, from the index or
from a recent pick of the same prefix still waiting for its KV events) and its requests in
flight. Then:

1. replicas whose in-flight count exceeds ``max_imbalance × (mean + 1)`` are skipped (one hot
   prefix never piles the pool onto one replica) — with a balance window, only those whose
   share of the recent picks also exceeds ``max_share ×`` the mean: a replica that holds a hot
   prefix keeps its followers through a burst of in-flight requests as long as it has not been
   taking more than its share over the window (moving them makes a second copy, which evicts
   other prefixes: measured, docs/benchmarks.md) — and never one that holds at least
   ``sticky_share`` of a prompt when what it holds is that conversation's own history
   (``shared`` False: no other request matched that prefix, or only this conversation's
   earlier turn did; :meth:`~filters.plugins.picker.pool.PoolPicker._shared`): moving a
   conversation prefills all of it again on a replica where it serves nobody else, while a
   second copy of a prefix many requests share pays back;
2. a share below ``min_prefix_tokens`` counts as 0 (a shared system prompt alone says nothing);
3. ``score = w × share − (1 − w) × inflight / (mean + 1)``, ``w = cache_weight``; the best
   score wins. If the winner holds nothing useful, or less than ``sticky_share`` of the prompt
   (a new conversation: often only a shared system prompt is cached), the score is taken again
   with each replica's prefill **backlog** as ``− w × b × backlog / prompt``, ``b =
   backlog_weight`` (``backlog_tokens``: prompt tokens the picker sent the replica that its KV
   events have not yet reported prefilled, past an allowance of about one prefill step): a
   prompt that loses nothing by going anywhere goes where it waits least, and a short prompt is
   not queued behind a long prefill. With a balance window the load in that second score is
   not the in-flight count but half the replica's recent share and half its radix tree's size
   (each over the pool mean): a prompt nobody holds goes to a replica that has lately been
   sent less and holds less, so the replica a hot prefix lives on is not given new ones too.
   A prompt mostly cached is not moved by backlogs (measured:
   moving follow-up turns off their cache cost 1–2 points of hit ratio on the trace and 7–9 on
   shared documents). Ties go to the replica whose radix tree is smallest (as sglang-router's
   ``cache_aware`` places a prefix it has not seen: new documents spread over the pool's cache
   instead of piling into one replica and evicting each other), then to a rendezvous hash of
   the prompt's first checkpoint (every gateway replica follows the same events and breaks them
   alike: the mesh stays active-active).

Reasons (metric label ``reason``): ``cache`` (the winner holds ≥ ``min_prefix_tokens``),
``load`` (no useful match, or the replica that has it is too busy: the least loaded wins),
and the fallbacks to Envoy's ring hash: ``cold`` (no replica known to the index),
``no_prompt`` (the prompt cannot be rendered: token ids, malformed body).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from filters.rendezvous import rendezvous

__all__ = ["Candidate", "Pick", "Weights", "choose"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica as the picker sees it for one prompt."""

    name: str  # host:port, as Envoy's override-host header wants it
    known: bool  # the prefix index follows its events (else: unknown, never picked)
    healthy: bool = True  # not marked down by the pool state
    matched_bytes: int = 0  # leading prompt bytes it holds (checkpoint granularity)
    matched_tokens: int = 0  # the same, in backend tokens (whole pages), for min_prefix_tokens
    inflight: int = 0
    cached_blocks: int = 0  # blocks the index holds for it (the size of its radix tree)
    backlog_tokens: int = 0  # sent to it, not yet reported prefilled (PoolPicker's estimate)
    recent: float = 0.0  # its picks over the balance window (decayed; PoolPicker's count)
    shared: bool = False  # an earlier request matched the same cached prefix (a hot one)


@dataclass(frozen=True, slots=True)
class Weights:
    cache_weight: float = 0.7
    max_imbalance: float = 1.5
    min_prefix_tokens: int = 256
    backlog_weight: float = 1.0
    sticky_share: float = 0.5
    balance_window: int = 0  # 0: in-flight counts alone (no recent shares)
    max_share: float = 1.3


@dataclass(frozen=True, slots=True)
class Pick:
    """The picker's answer; ``replica`` None = leave it to ring hash."""

    replica: str | None
    reason: str
    predicted_tokens: int = 0  # tokens the chosen replica should find in its cache
    predicted_bytes: int = 0  # the same, in leading prompt bytes (whole checkpoints)


def choose(
    candidates: Sequence[Candidate],
    prompt_len: int,
    weights: Weights,
    tie_key: bytes = b"",
    prompt_tokens: int = 0,
) -> Pick:
    """The replica for one prompt of ``prompt_len`` bytes (about ``prompt_tokens`` tokens);
    see the module docstring."""
    live = [c for c in candidates if c.known and c.healthy]
    if not live:
        return Pick(None, "cold")
    mean = sum(c.inflight for c in live) / len(live)
    bound = weights.max_imbalance * (mean + 1)
    shares = weights.balance_window > 0
    recent = (sum(c.recent for c in live) / len(live) or 1.0) if shares else 1.0
    blocks = (sum(c.cached_blocks for c in live) / len(live) or 1.0) if shares else 1.0
    cap = weights.max_share * recent

    w = weights.cache_weight
    size = max(prompt_len, 1)
    per_token = weights.backlog_weight / max(prompt_tokens, 1)
    sticky = weights.sticky_share * size

    def ok(c: Candidate) -> bool:
        if c.inflight + 1 <= bound or (shares and c.recent <= cap):
            return True
        # a conversation's own history, mostly cached there: moving it prefills it all again
        own = not c.shared and c.matched_tokens >= weights.min_prefix_tokens
        return own and c.matched_bytes >= sticky

    allowed = [c for c in live if ok(c)] or [min(live, key=_load)]

    def load(c: Candidate, placing: bool) -> float:
        if placing and shares:  # a prompt nobody holds: the recent picks and the cache's size
            return 0.5 * c.recent / recent + 0.5 * c.cached_blocks / blocks
        return c.inflight / (mean + 1)

    def useful(c: Candidate) -> bool:
        return c.matched_tokens >= weights.min_prefix_tokens and c.matched_bytes > 0

    def score(c: Candidate, backlog: bool) -> tuple[float, int, int]:
        share = min(c.matched_bytes / size, 1.0) if useful(c) else 0.0
        wait = c.backlog_tokens * per_token if backlog else 0.0
        value = w * (share - wait) - (1 - w) * load(c, backlog)
        return (value, -c.cached_blocks, rendezvous(tie_key, c.name))

    best = max(allowed, key=lambda c: score(c, False))
    if not useful(best) or best.matched_bytes < sticky:
        # little of it cached anywhere: where this prompt waits least
        best = max(allowed, key=lambda c: score(c, True))
    reason = "cache" if useful(best) else "load"
    return Pick(best.name, reason, best.matched_tokens, best.matched_bytes)


def _load(c: Candidate) -> int:
    return c.inflight
